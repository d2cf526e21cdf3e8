"""Turnpike's A2A and MCP endpoints, driven by the ecosystem's own clients: the official A2A
client (`a2a-sdk`, protocol 1.0) and the `mcp` client over streamable HTTP.

Usage: a2a_client.py a2a|push|mcp <base-url> <token> <bob-token> <beta-token>

Each check prints `ok <name>`; any failure raises (a non-zero exit). The last line is a JSON
object of what the Rust side checks again in the record (task and conversation ids).
"""

import asyncio
import base64
import json
import sys
import uuid
import warnings
from datetime import timedelta

import httpx

MODE, BASE, TOKEN, BOB, BETA = sys.argv[1:6]
AGENT = f"{BASE}/a2a/relay/helper"
REPORT = {}


def ok(name):
    print(f"ok {name}", flush=True)


# ---------------------------------------------------------------------------------------------
# A2A
# ---------------------------------------------------------------------------------------------

from a2a.client import A2ACardResolver, ClientConfig, create_client  # noqa: E402
from a2a.client.errors import A2AClientError  # noqa: E402
from a2a.helpers import get_artifact_text, get_message_text  # noqa: E402
from a2a.types import (  # noqa: E402
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import (  # noqa: E402
    TaskNotCancelableError,
    TaskNotFoundError,
)
from google.protobuf.json_format import MessageToDict  # noqa: E402


def message(text, task_id="", context_id="", parts=()):
    return Message(
        message_id=str(uuid.uuid4()),
        role=Role.ROLE_USER,
        parts=([Part(text=text)] if text else []) + list(parts),
        task_id=task_id,
        context_id=context_id,
    )


def kind(ev):
    return ev.WhichOneof("payload")


def state(task):
    return TaskState.Name(task.status.state)


def reply_of(task):
    for a in task.artifacts:
        if a.artifact_id == "reply":
            return get_artifact_text(a, "")
    return ""


def http_for(token):
    return httpx.AsyncClient(
        headers={"Authorization": f"Bearer {token}"},
        timeout=httpx.Timeout(60.0, read=120.0),
    )


async def clients(token):
    http = http_for(token)
    streaming = await create_client(AGENT, client_config=ClientConfig(httpx_client=http, streaming=True))
    blocking = await create_client(AGENT, client_config=ClientConfig(httpx_client=http, streaming=False))
    return http, streaming, blocking


async def send(client, msg, configuration=None):
    req = SendMessageRequest(message=msg)
    if configuration is not None:
        req = SendMessageRequest(message=msg, configuration=configuration)
    events = [ev async for ev in client.send_message(req)]
    assert len(events) == 1 and kind(events[0]) == "task", events
    return events[0].task


async def rpc(http, method, params, raw=None):
    body = raw if raw is not None else json.dumps({"jsonrpc": "2.0", "id": "1", "method": method, "params": params})
    r = await http.post(AGENT, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200, (method, r.status_code, r.text)
    return r.json()


async def a2a():
    http, streaming, blocking = await clients(TOKEN)

    # The card: discovered at the well-known path under the agent's URL.
    card = await A2ACardResolver(http, AGENT).get_agent_card()
    assert card.name == "relay/helper", card.name
    assert "writes files" in card.description, card.description
    assert [s.id for s in card.skills] == ["answer", "files"], card.skills
    assert card.supported_interfaces[0].url == AGENT, card.supported_interfaces
    assert card.supported_interfaces[0].protocol_binding == "JSONRPC"
    assert card.capabilities.streaming
    assert "bearer" in card.security_schemes
    listed = (await http.get(f"{BASE}/v1/agent-cards")).json()["cards"]
    ours = [c["name"] for c in listed if not c["name"].startswith("demo/")]
    assert ours == ["relay/helper", "relay/publisher", "relay/quiet"], ours
    ok("card")

    # Send a message (the client waits for the task): the reply.
    task = await send(blocking, message("hello there"))
    assert state(task) == "TASK_STATE_COMPLETED", task
    assert reply_of(task) == "answer to: hello there", reply_of(task)
    assert task.context_id.startswith("conv_") and task.id.startswith(task.context_id + "-")
    assert [m.role for m in task.history] == [Role.ROLE_USER, Role.ROLE_AGENT]
    REPORT["hello"] = {"task": task.id, "context": task.context_id}
    # The same message again (a client's retry) is the same task: the message id is the
    # submission's idempotency key.
    again = message("and more", context_id=task.context_id)
    first = await send(blocking, again)
    second = await send(blocking, again)
    assert first.id == second.id and first.context_id == task.context_id, (first.id, second.id)
    assert reply_of(first) == "answer to: and more"
    ok("retry")
    ok("send")

    # A message in the same context is another task of the same conversation.
    assert first.id != task.id
    ok("same context")

    # Stream: the text arrives in pieces before the task completes, and adds up to the reply.
    events = []
    async for ev in streaming.send_message(SendMessageRequest(message=message("slow story please"))):
        events.append(ev)
    kinds = [kind(ev) for ev in events]
    assert kinds[0] == "task", kinds
    assert kinds[-1] == "status_update" and state(events[-1].status_update) == "TASK_STATE_COMPLETED", kinds
    # As the client applies them: a piece appends (or, the first, starts the artifact); the last
    # update is the whole committed reply.
    updates = [(i, ev.artifact_update) for i, ev in enumerate(events) if kind(ev) == "artifact_update"]
    pieces = [(i, u) for i, u in updates if not u.last_chunk]
    assert len(pieces) >= 3, f"streamed in {len(pieces)} pieces: {kinds}"
    streamed = ""
    for _, u in pieces:
        piece = get_artifact_text(u.artifact, "")
        streamed = streamed + piece if u.append else piece
    whole = get_artifact_text(updates[-1][1].artifact, "")
    assert updates[-1][1].last_chunk and not updates[-1][1].append, kinds
    assert whole.startswith("Once upon a time") and whole.endswith("ever after."), whole
    assert streamed.strip() == whole, (streamed, whole)
    # Every piece came before the task completed, and before the whole reply.
    assert pieces[-1][0] < updates[-1][0] < len(events) - 1
    ok("stream")

    # Get a task, with and without history.
    got = await streaming.get_task(GetTaskRequest(id=task.id))
    assert got.id == task.id and state(got) == "TASK_STATE_COMPLETED" and reply_of(got) == reply_of(task)
    short = await streaming.get_task(GetTaskRequest(id=task.id, history_length=1))
    assert len(short.history) == 1 and short.history[0].role == Role.ROLE_AGENT
    ok("get")

    # Cancel a running task: the turn ends cancelled; a second cancel is refused.
    started = await send(blocking, message("long job"), SendMessageConfiguration(return_immediately=True))
    assert state(started) in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"), state(started)
    # Wait until it is working (its turn is dispatched), then cancel.
    for _ in range(600):
        now = await streaming.get_task(GetTaskRequest(id=started.id))
        if state(now) == "TASK_STATE_WORKING":
            break
        await asyncio.sleep(0.05)
    assert state(now) == "TASK_STATE_WORKING", state(now)
    cancelled = await streaming.cancel_task(CancelTaskRequest(id=started.id))
    assert state(cancelled) == "TASK_STATE_CANCELED", cancelled
    try:
        await streaming.cancel_task(CancelTaskRequest(id=started.id))
        raise AssertionError("a cancelled task was cancelled again")
    except TaskNotCancelableError:
        pass
    REPORT["cancelled"] = {"task": cancelled.id, "context": cancelled.context_id}
    ok("cancel")

    # Resubscribe after a dropped stream: nothing is missed.
    stream = streaming.send_message(SendMessageRequest(message=message("slow story again")))
    first_event = await anext(stream)
    assert kind(first_event) == "task"
    dropped = first_event.task.id
    await stream.aclose()
    resumed = [ev async for ev in streaming.subscribe(SubscribeToTaskRequest(id=dropped))]
    assert kind(resumed[0]) == "task", [kind(e) for e in resumed]
    assert state(resumed[-1].status_update) == "TASK_STATE_COMPLETED"
    replies = [ev.artifact_update for ev in resumed if kind(ev) == "artifact_update" and not ev.artifact_update.append]
    text = get_artifact_text(replies[-1].artifact, "") if replies else reply_of(resumed[0].task)
    assert text.startswith("Once upon a time") and text.endswith("ever after."), text
    finished = await streaming.get_task(GetTaskRequest(id=dropped))
    assert reply_of(finished) == text
    ok("resubscribe")

    # A question makes the task input-required; the answer, on the same task, resumes it.
    asked = await send(blocking, message("pick a colour"))
    assert state(asked) == "TASK_STATE_INPUT_REQUIRED", asked
    assert "Which colour?" in get_message_text(asked.status.message)
    data = [MessageToDict(p)["data"] for p in asked.status.message.parts if p.HasField("data")]
    assert data and data[0]["kind"] == "question", data
    # Waiting for input, it is not cancelled by a stop (a pending answer stays pending): the
    # answer ends it.
    try:
        await streaming.cancel_task(CancelTaskRequest(id=asked.id))
        raise AssertionError("a task waiting for input was cancelled")
    except TaskNotCancelableError:
        pass
    answered = await send(blocking, message("blue", task_id=asked.id, context_id=asked.context_id))
    assert answered.id == asked.id and state(answered) == "TASK_STATE_COMPLETED", answered
    assert reply_of(answered).startswith("answer to:") and "blue" in reply_of(answered), reply_of(answered)
    ok("question")

    # A gated call: input-required with the approval's card; "approve" resumes it and the
    # published file comes out as a file part by link.
    publisher_url = f"{BASE}/a2a/relay/publisher"
    publisher = await create_client(publisher_url, client_config=ClientConfig(httpx_client=http, streaming=True))
    publisher_blocking = await create_client(publisher_url, client_config=ClientConfig(httpx_client=http, streaming=False))
    gated = await send(publisher_blocking, message("publish the notes"))
    assert state(gated) == "TASK_STATE_INPUT_REQUIRED", gated
    data = [MessageToDict(p)["data"] for p in gated.status.message.parts if p.HasField("data")]
    assert data and data[0]["kind"] == "approval" and data[0]["tool"] == "publish", data
    events = [ev async for ev in publisher.send_message(SendMessageRequest(
        message=message("approve", task_id=gated.id, context_id=gated.context_id)))]
    assert kind(events[0]) == "status_update", [kind(e) for e in events]
    assert state(events[-1].status_update) == "TASK_STATE_COMPLETED", [kind(e) for e in events]
    done = await publisher.get_task(GetTaskRequest(id=gated.id))
    files = [p for a in done.artifacts if a.artifact_id == "files" for p in a.parts]
    assert len(files) == 1 and files[0].filename == "note.md", done.artifacts
    anonymous = httpx.AsyncClient(timeout=30)
    body = await anonymous.get(files[0].url)
    assert body.status_code == 200 and body.text == "publish the notes", (body.status_code, body.text)
    REPORT["gated"] = {"task": gated.id, "context": gated.context_id}
    ok("approval")

    # A file goes in (bytes) and comes back named in the reply, as a link.
    attached = await send(blocking, message("attach check", parts=[
        Part(raw=b"hello file\n", media_type="text/plain", filename="notes.txt")]))
    assert state(attached) == "TASK_STATE_COMPLETED", attached
    assert "You attached conv:at:" in reply_of(attached), reply_of(attached)
    sent = [p for m in attached.history for p in m.parts if p.filename == "notes.txt"]
    assert sent and sent[0].url, attached.history
    assert (await anonymous.get(sent[0].url)).text == "hello file\n"
    out = [p for a in attached.artifacts if a.artifact_id == "files" for p in a.parts]
    assert out and (await anonymous.get(out[0].url)).text == "hello file\n"
    ok("files")

    # Another identity, another tenant: nothing.
    for other in (BOB, BETA):
        o_http, o_streaming, o_blocking = await clients(other)
        for call in (
            lambda: o_streaming.get_task(GetTaskRequest(id=task.id)),
            lambda: o_streaming.cancel_task(CancelTaskRequest(id=started.id)),
        ):
            try:
                await call()
                raise AssertionError("another identity reached a task")
            except TaskNotFoundError:
                pass
        try:
            [e async for e in o_streaming.subscribe(SubscribeToTaskRequest(id=asked.id))]
            raise AssertionError("another identity subscribed to a task")
        except TaskNotFoundError:
            pass
        reply = await rpc(o_http, "SendMessage", {"message": {
            "messageId": "x", "role": "ROLE_USER", "parts": [{"text": "hi"}], "contextId": task.context_id}})
        assert reply["error"]["code"] == -32602 and "not found" in reply["error"]["message"], reply
        reply = await rpc(o_http, "SendMessage", {"message": {
            "messageId": "y", "role": "ROLE_USER", "parts": [{"text": "hi"}], "taskId": asked.id}})
        assert reply["error"]["code"] == -32001, reply
        await o_http.aclose()
    # The app offered to tenant beta only has no card for this tenant, and beta sees it.
    assert (await http.get(f"{BASE}/a2a/secret/keeper/.well-known/agent-card.json")).status_code == 404
    beta = http_for(BETA)
    assert (await beta.get(f"{BASE}/a2a/secret/keeper/.well-known/agent-card.json")).status_code == 200
    theirs = [c["name"] for c in (await beta.get(f"{BASE}/v1/agent-cards")).json()["cards"]]
    assert [n for n in theirs if not n.startswith("demo/")] == ["relay/helper", "relay/publisher", "relay/quiet", "secret/keeper"], theirs
    # The apps list and a refused conversation name no app of another tenant's either.
    assert "secret" in [a["id"] for a in (await beta.get(f"{BASE}/v1/apps")).json()["apps"]]
    await beta.aclose()
    assert "secret" not in [a["id"] for a in (await http.get(f"{BASE}/v1/apps")).json()["apps"]]
    refused = await http.post(f"{BASE}/v1/conversations", json={"app": "nope", "agent": "x"})
    assert refused.status_code == 404 and "secret" not in refused.text, refused.text
    refused = await http.post(f"{BASE}/v1/conversations", json={"app": "secret", "agent": "keeper"})
    assert refused.status_code == 404, refused.text
    assert (await httpx.AsyncClient().get(f"{AGENT}/.well-known/agent-card.json")).status_code == 401
    ok("isolation")

    # Bad input: the protocol's errors, never a 500.
    assert (await rpc(http, "", None, raw="{not json"))["error"]["code"] == -32700
    assert (await rpc(http, "", None, raw="[]"))["error"]["code"] == -32600
    assert (await rpc(http, "", None, raw='{"jsonrpc":"2.0","method":"GetTask"}'))["error"]["code"] == -32600
    assert (await rpc(http, "NoSuchMethod", {}))["error"]["code"] == -32601
    assert (await rpc(http, "GetTask", {"id": 7}))["error"]["code"] == -32602
    assert (await rpc(http, "GetTask", {"id": "conv_nope-1"}))["error"]["code"] == -32001
    # A made-up sequence past the lane's end is no task to come; a stop's is no task at all.
    assert (await rpc(http, "GetTask", {"id": f"{task.context_id}-99999"}))["error"]["code"] == -32001
    assert (await rpc(http, "CancelTask", {"id": f"{task.context_id}-99999"}))["error"]["code"] == -32001
    assert (await rpc(http, "GetTask", {"id": f"{cancelled.context_id}-2"}))["error"]["code"] == -32001
    assert (await rpc(http, "", None, raw='{"jsonrpc":"2.0","id":1,"method":"GetTask","params":[1]}'))["error"]["code"] == -32602
    big = {"message": {"messageId": "big", "role": "ROLE_USER", "parts": [{"text": "x" * 70000}]}}
    assert (await rpc(http, "SendMessage", big))["error"]["code"] == -32602
    many = {"message": {"messageId": "many", "role": "ROLE_USER", "parts": [{"text": "x"}] * 40}}
    assert (await rpc(http, "SendMessage", many))["error"]["code"] == -32602
    notb64 = {"message": {"messageId": "b64", "role": "ROLE_USER", "parts": [{"raw": "***", "filename": "a.txt"}]}}
    assert (await rpc(http, "SendMessage", notb64))["error"]["code"] == -32602
    by_url = {"message": {"messageId": "url", "role": "ROLE_USER", "parts": [{"url": "http://169.254.169.254/"}]}}
    assert (await rpc(http, "SendMessage", by_url))["error"]["code"] == -32005
    agent_role = {"message": {"messageId": "r", "role": "ROLE_AGENT", "parts": [{"text": "x"}]}}
    assert (await rpc(http, "SendMessage", agent_role))["error"]["code"] == -32602
    # A task of another conversation named with this one's context.
    crossed = {"message": {"messageId": "c", "role": "ROLE_USER", "parts": [{"text": "x"}],
                           "contextId": task.context_id, "taskId": asked.id}}
    reply = await rpc(http, "SendMessage", crossed)
    assert reply["error"]["code"] == -32602 and "another context" in reply["error"]["message"], reply
    # A message to a finished task.
    reply = await rpc(http, "SendMessage", {"message": {
        "messageId": "f", "role": "ROLE_USER", "parts": [{"text": "x"}], "taskId": task.id}})
    assert reply["error"]["code"] == -32004, reply
    # Subscribing to a finished task.
    reply = await rpc(http, "SubscribeToTask", {"id": task.id})
    assert reply["error"]["code"] == -32004, reply
    # A context of another app's agent.
    quiet = await create_client(f"{BASE}/a2a/relay/quiet", client_config=ClientConfig(httpx_client=http, streaming=False))
    q = await send(quiet, message("hi quiet"))
    assert reply_of(q) == "quiet here", reply_of(q)
    ok("bad input")

    await http.aclose()
    await anonymous.aclose()


async def push():
    """Push notifications: one given with the message, one made, read, listed and deleted."""
    from a2a.types import (
        DeleteTaskPushNotificationConfigRequest,
        GetTaskPushNotificationConfigRequest,
        ListTaskPushNotificationConfigsRequest,
        TaskPushNotificationConfig,
    )
    import os

    receiver = os.environ["A2A_RECEIVER"]
    http, streaming, blocking = await clients(TOKEN)
    config = TaskPushNotificationConfig(url=f"{receiver}/flaky/push", token="tok-push-123")
    config.authentication.scheme = "Bearer"
    config.authentication.credentials = "push-secret"
    held = await send(blocking, message("hold for push"), SendMessageConfiguration(
        return_immediately=True, task_push_notification_config=config))
    assert state(held) in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"), held
    second = await streaming.create_task_push_notification_config(TaskPushNotificationConfig(
        task_id=held.id, url=f"{receiver}/ok/second", id="second"))
    assert second.id == "second" and second.task_id == held.id, second
    listed = await streaming.list_task_push_notification_configs(
        ListTaskPushNotificationConfigsRequest(task_id=held.id))
    assert sorted(c.url.rsplit("/", 1)[-1] for c in listed.configs) == ["push", "second"], listed
    got = await streaming.get_task_push_notification_config(
        GetTaskPushNotificationConfigRequest(task_id=held.id, id="second"))
    assert got.url.endswith("/ok/second"), got
    await streaming.delete_task_push_notification_config(
        DeleteTaskPushNotificationConfigRequest(task_id=held.id, id="second"))
    listed = await streaming.list_task_push_notification_configs(
        ListTaskPushNotificationConfigsRequest(task_id=held.id))
    assert [c.url.rsplit("/", 1)[-1] for c in listed.configs] == ["push"], listed
    # Another identity: no configs of this task, and none made for it.
    o_http, o_streaming, _ = await clients(BOB)
    try:
        await o_streaming.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=held.id))
        raise AssertionError("another identity listed a task's configs")
    except TaskNotFoundError:
        pass
    await o_http.aclose()
    ok("push configs")
    # Let the task end: a follow-up reaches the lane, the held step goes on.
    done = await send(blocking, message("go on", task_id=held.id, context_id=held.context_id))
    assert state(done) == "TASK_STATE_COMPLETED", done
    # Another task in the same conversation: not the config's, nothing of it is pushed.
    other = await send(blocking, message("another task", context_id=held.context_id))
    assert state(other) == "TASK_STATE_COMPLETED" and other.id != held.id
    REPORT["push"] = {"task": held.id, "context": held.context_id}
    ok("push task")
    await http.aclose()


# ---------------------------------------------------------------------------------------------
# MCP
# ---------------------------------------------------------------------------------------------


async def mcp():
    from mcp import ClientSession
    from mcp.shared.exceptions import McpError

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from mcp.client.streamable_http import streamablehttp_client

        transport = streamablehttp_client(f"{BASE}/mcp", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    async with transport as (read, write, _):
        async with ClientSession(read, write, read_timeout_seconds=timedelta(seconds=120)) as session:
            init = await session.initialize()
            assert init.serverInfo.name == "turnpike"
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert sorted(tools) == ["list_agents", "list_conversations", "read_conversation", "search", "send_message"], sorted(tools)
            ok("mcp tools")

            agents = await session.call_tool("list_agents", {})
            assert not agents.isError and "relay/helper" in agents.content[0].text, agents
            assert "secret/keeper" not in agents.content[0].text

            sent = await session.call_tool("send_message", {"app": "relay", "agent": "helper", "text": "hello from an IDE about turbines"})
            assert not sent.isError, sent
            assert sent.structuredContent["state"] == "completed", sent.structuredContent
            assert sent.content[0].text == "answer to: hello from an IDE about turbines", sent.content[0].text
            conversation = sent.structuredContent["conversation"]
            again = await session.call_tool("send_message", {"conversation": conversation, "text": "second message"})
            assert again.content[0].text == "answer to: second message", again
            ok("mcp send")

            rows = await session.call_tool("read_conversation", {"conversation": conversation})
            kinds = [r["kind"] for r in rows.structuredContent["rows"]]
            assert kinds.count("user_message") == 2 and kinds.count("assistant_message") == 2, kinds
            listed = await session.call_tool("list_conversations", {"limit": 100})
            assert conversation in [c["id"] for c in listed.structuredContent["conversations"]]
            ok("mcp read")

            # Search: the turn is indexed after it ends; wait for it (bounded).
            for _ in range(600):
                found = await session.call_tool("search", {"query": "turbines", "mode": "lexical"})
                assert not found.isError, found
                if any(h["conversation"] == conversation for h in found.structuredContent["hits"]):
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"search never found the conversation: {found.structuredContent}")
            ok("mcp search")

            # Calls that do not fit a tool: protocol errors; a tool that fails: isError.
            for name, args in (("no_such_tool", {}), ("search", {}), ("search", {"query": 5}),
                               ("send_message", {"text": "x"}), ("list_agents", {"extra": 1})):
                try:
                    await session.call_tool(name, args)
                    raise AssertionError(f"{name} {args} was taken")
                except McpError as e:
                    assert e.error.code == -32602, (name, e.error)
            missing = await session.call_tool("read_conversation", {"conversation": "conv_00000000000000000000000000"})
            assert missing.isError and "not_found" in missing.content[0].text, missing
            REPORT["mcp"] = {"context": conversation}
            ok("mcp errors")

    # Another identity reads nothing of it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        transport = streamablehttp_client(f"{BASE}/mcp", headers={"Authorization": f"Bearer {BOB}"}, timeout=60)
    async with transport as (read, write, _):
        async with ClientSession(read, write, read_timeout_seconds=timedelta(seconds=60)) as session:
            await session.initialize()
            theirs = await session.call_tool("read_conversation", {"conversation": conversation})
            assert theirs.isError and "not_found" in theirs.content[0].text, theirs
            sent = await session.call_tool("send_message", {"conversation": conversation, "text": "intrude"})
            assert sent.isError, sent
            found = await session.call_tool("search", {"query": "turbines", "mode": "lexical"})
            assert all(h["conversation"] != conversation for h in found.structuredContent["hits"])
            ok("mcp isolation")

    # The raw protocol: unknown methods, notifications, GET.
    async with http_for(TOKEN) as http:
        r = await http.post(f"{BASE}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "server/discover"})
        assert r.status_code == 200 and r.json()["error"]["code"] == -32601, r.text
        r = await http.post(f"{BASE}/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert r.status_code == 202 and r.content == b"", r
        r = await http.post(f"{BASE}/mcp", content=b"{oops")
        assert r.status_code == 200 and r.json()["error"]["code"] == -32700
        r = await http.get(f"{BASE}/mcp")
        assert r.status_code == 405
        r = await httpx.AsyncClient().post(f"{BASE}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert r.status_code == 401
        ok("mcp protocol")


asyncio.run({"a2a": a2a, "mcp": mcp, "push": push}[MODE]())
print(json.dumps(REPORT), flush=True)
