"""The app, its per-turn context, and the HTTP server the worker calls."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, List, Optional

from . import http

PROTOCOL_VERSION = 2
log = logging.getLogger("turnpike_app")


class Parked(Exception):
    """The call parks the turn (an approval, a question); the handler should end."""

    def __init__(self, call_id: str, reason: str):
        super().__init__(f"{call_id}: {reason}")
        self.call_id = call_id
        self.reason = reason


class Refused(Exception):
    """The worker refused an action of this handler; the turn fails with this reason."""


@dataclass
class ToolResult:
    ok: bool
    output: Any
    call_id: str = ""
    tool: str = ""


@dataclass
class ModelReply:
    text: str
    tool_calls: List[Dict[str, Any]] = field(default_factory=list)
    usage: Optional[Dict[str, int]] = None


@dataclass
class Event:
    """Something the user sent while the turn runs: `kind` is the record's block kind
    (`follow_up`, `steer`, `attachment`, ...)."""

    kind: str
    text: str
    block: Dict[str, Any]


class Context:
    """One turn, as a handler sees it."""

    def __init__(self, body: Dict[str, Any], emit: Callable[[Dict[str, Any]], Awaitable[None]]):
        self.raw = body
        self.exchange: str = body.get("exchange", "")
        self.idempotency_key: str = body.get("idempotency_key", "")
        self.attempt: str = body.get("attempt", "")
        self.tenant: str = body.get("tenant", "")
        self.conversation: str = body.get("conversation", "")
        self.turn = body.get("turn")
        self.app: str = body.get("app", "")
        self.agent: str = body.get("agent", "")
        self.identity: str = body.get("identity", "")
        self.system_prompt: str = body.get("system_prompt", "")
        self.inputs: List[Dict[str, Any]] = body.get("inputs", [])
        self.history: List[Dict[str, Any]] = body.get("history", [])
        self.tools: List[Dict[str, Any]] = body.get("tools", [])
        self.limits: Dict[str, Any] = body.get("limits", {})
        self.events: List[Event] = []
        self._emit = emit
        self._waiting: Dict[str, asyncio.Future] = {}
        self._taken: List[Event] = []
        self._ids = 0

    @property
    def text(self) -> str:
        """What the user said this turn (its message and follow-ups, one per line)."""
        kinds = ("user_message", "follow_up", "steer")
        return "\n".join(b.get("text", "") for b in self.inputs if b.get("kind") in kinds)

    @property
    def resumed(self) -> List[ToolResult]:
        """Results of calls that were answered (approved) before this turn called the app."""
        calls = {b["call_id"]: b.get("tool", "") for b in self.inputs if b.get("kind") == "tool_call"}
        for m in self.history:
            for c in m.get("tool_calls", []):
                calls.setdefault(c.get("id", ""), c.get("name", ""))
        out = []
        for b in self.inputs:
            if b.get("kind") == "tool_result":
                out.append(
                    ToolResult(
                        ok=b.get("ok", False),
                        output=b.get("output"),
                        call_id=b.get("call_id", ""),
                        tool=calls.get(b.get("call_id", ""), ""),
                    )
                )
        return out

    def files(self) -> List[Dict[str, Any]]:
        """Files published this turn so far, as the record's `file` blocks."""
        return [b for b in self.inputs if b.get("kind") == "file"]

    def _next_id(self, prefix: str) -> str:
        # Unique across turns and attempts: a retried turn's calls are new calls.
        self._ids += 1
        return f"{self.turn}-{self.attempt[:8]}-{prefix}{self._ids}"

    async def say(self, text: str) -> None:
        """Streams text to the user; consecutive calls make one reply."""
        if text:
            await self._emit({"type": "say", "text": text})

    async def _call(self, action: Dict[str, Any]) -> Dict[str, Any]:
        future = asyncio.get_running_loop().create_future()
        self._waiting[action["id"]] = future
        await self._emit(action)
        try:
            return await future
        finally:
            self._waiting.pop(action["id"], None)

    async def tool(self, name: str, arguments: Optional[Dict[str, Any]] = None, **kwargs) -> ToolResult:
        """Calls one of the agent's tools; raises `Parked` when it waits for an approval."""
        args = dict(arguments or {})
        args.update(kwargs)
        call_id = self._next_id("t")
        answer = await self._call({"type": "tool", "id": call_id, "name": name, "arguments": args})
        return ToolResult(answer.get("ok", False), answer.get("output"), call_id, name)

    async def publish(self, path: str, content: Optional[str] = None) -> ToolResult:
        """Publishes a workspace file (writing `content` to it first when given)."""
        if content is not None:
            written = await self.tool("write_file", path=path, content=content)
            if not written.ok:
                return written
        call_id = self._next_id("p")
        answer = await self._call({"type": "publish", "id": call_id, "path": path})
        return ToolResult(answer.get("ok", False), answer.get("output"), call_id, "publish")

    async def ask_user(self, question: str) -> None:
        """Asks the user; the turn parks until they answer (this raises `Parked`)."""
        call_id = self._next_id("q")
        await self._call({"type": "ask_user", "id": call_id, "question": question})

    async def model(
        self,
        messages: Optional[List[Dict[str, Any]]] = None,
        tools: bool = False,
        say: bool = False,
        temperature: Optional[float] = None,
        max_tokens: Optional[int] = None,
    ) -> ModelReply:
        """Asks the deployment's model. Without `messages`, it sees the conversation as the
        built-in loop would send it. `say=True` streams its text to the user as well."""
        action: Dict[str, Any] = {"type": "model", "id": self._next_id("m"), "tools": tools, "say": say}
        if messages is not None:
            action["messages"] = [
                {"role": m["role"], "content": m.get("content", "")} for m in messages
            ]
        if temperature is not None:
            action["temperature"] = temperature
        if max_tokens is not None:
            action["max_tokens"] = max_tokens
        answer = await self._call(action)
        return ModelReply(answer.get("text", ""), answer.get("tool_calls", []), answer.get("usage"))

    async def next_event(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next follow-up (or steer, attachment) the user sent during the turn; `None`
        after `timeout` seconds (`None`: up to the turn's deadline).

        Events are taken into this turn only when asked for here: what the user sends that the
        handler does not take before it returns starts the next turn, with its own reply.
        Give the wait a bound with `timeout` (Turnpike ends it) rather than cancelling it: an
        event taken just as a cancelled wait ends is this turn's, and is returned by the next
        call here, or by none."""
        if not self._taken:
            if timeout is None:
                wait_ms = int(self.limits.get("deadline_ms", 600_000))
            else:
                wait_ms = max(0, int(timeout * 1000))
            answer = await self._call({"type": "next_events", "id": self._next_id("e"), "wait_ms": wait_ms})
            for block in answer.get("blocks", []):
                event = Event(block.get("kind", ""), block.get("text", ""), block)
                self.events.append(event)
                self._taken.append(event)
        return self._taken.pop(0) if self._taken else None

    def _deliver(self, message: Dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "events":
            future = self._waiting.get(message.get("id", ""))
            if future is not None and not future.done():
                future.set_result(message)
            else:
                # The wait was given up (a timeout around `next_event`, a cancelled task):
                # what it took is this turn's all the same, so the next `next_event` gets it.
                for block in message.get("blocks", []):
                    event = Event(block.get("kind", ""), block.get("text", ""), block)
                    self.events.append(event)
                    self._taken.append(event)
        elif kind in ("tool_result", "model_result"):
            future = self._waiting.get(message.get("id", ""))
            if future is not None and not future.done():
                future.set_result(message)
        elif kind == "parked":
            future = self._waiting.get(message.get("id", ""))
            if future is not None and not future.done():
                future.set_exception(Parked(message.get("id", ""), message.get("reason", "")))
        elif kind == "refused":
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(Refused(message.get("message", "")))


class _Exchange:
    def __init__(self, ctx: Context, task: "asyncio.Task[None]"):
        self.ctx = ctx
        self.task = task


Handler = Callable[[Context], Awaitable[None]]


class App:
    """An app: one `on_reactive_event` handler, served to Turnpike workers over HTTP."""

    def __init__(self, secret: Optional[str] = None, secret_env: Optional[str] = None,
                 keepalive_seconds: float = 5.0):
        if secret is None and secret_env:
            secret = os.environ.get(secret_env)
            if secret is None:
                raise RuntimeError(f"the secret variable {secret_env} is not set")
        if secret is not None and not secret:
            raise RuntimeError("the secret is empty: set one, or pass none to accept any caller")
        self.secret = secret
        self.keepalive_seconds = keepalive_seconds
        self._handler: Optional[Handler] = None
        self._exchanges: Dict[str, _Exchange] = {}
        self._by_key: Dict[str, str] = {}

    def on_reactive_event(self, handler: Handler) -> Handler:
        """Registers the turn handler (a decorator)."""
        self._handler = handler
        return handler

    def run(self, host: str = "127.0.0.1", port: int = 8080) -> None:
        """Serves until interrupted."""
        asyncio.run(self.serve(host, port))

    async def serve(self, host: str = "127.0.0.1", port: int = 8080,
                    started: Optional[Callable[[int], None]] = None) -> None:
        """Serves on `host:port` (port 0: any free port, passed to `started`)."""
        if self._handler is None:
            raise RuntimeError("no handler: decorate one with @app.on_reactive_event")
        server = await asyncio.start_server(self._connection, host, port)
        bound = server.sockets[0].getsockname()[1]
        log.info("serving on %s:%s", host, bound)
        if started:
            started(bound)
        async with server:
            await server.serve_forever()

    def _authorized(self, request: http.Request) -> bool:
        if self.secret is None:
            return True
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {self.secret}".encode())

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await http.read_head(reader)
                if request is None:
                    return
                # Nobody's body is read before they are known.
                health = request.method == "GET" and request.path.split("?", 1)[0] == "/healthz"
                if not health and not self._authorized(request):
                    await http.respond(writer, 401, {"error": "unauthorized"}, close=True)
                    return
                await http.read_body(reader, request)
                if not await self._route(request, reader, writer):
                    return
        except http.BadRequest as e:
            try:
                await http.respond(writer, 400, {"error": str(e)}, close=True)
            except ConnectionError:
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            pass
        finally:
            writer.close()

    async def _route(self, request: http.Request, reader, writer) -> bool:
        """Answers one request; `False` closes the connection."""
        path = request.path.split("?", 1)[0]
        if request.method == "GET" and path == "/healthz":
            await http.respond(writer, 200, {"ok": True})
            return True
        if request.method != "POST":
            await http.respond(writer, 405, {"error": "method not allowed"})
            return True
        try:
            body = json.loads(request.body or b"{}")
        except ValueError as e:
            await http.respond(writer, 400, {"error": f"not JSON: {e}"})
            return True
        if not isinstance(body, dict):
            await http.respond(writer, 400, {"error": "the body must be a JSON object"})
            return True
        if path == "/v1/turns":
            await self._turn(body, reader, writer)
            return False
        parts = path.strip("/").split("/")
        if len(parts) == 4 and parts[:2] == ["v1", "turns"] and parts[3] == "messages":
            exchange = self._exchanges.get(parts[2])
            if exchange is None:
                await http.respond(writer, 404, {"error": "no such exchange"})
                return True
            self._message(exchange, body)
            await http.respond(writer, 204, None)
            return True
        await http.respond(writer, 404, {"error": "not found"})
        return True

    def _message(self, exchange: _Exchange, body: Dict[str, Any]) -> None:
        kind = body.get("type")
        log.info("exchange %s: %s", exchange.ctx.exchange, kind)
        if kind in ("stop", "end"):
            exchange.task.cancel()
        else:
            exchange.ctx._deliver(body)

    async def _turn(self, body: Dict[str, Any], reader, writer) -> None:
        if body.get("protocol") != PROTOCOL_VERSION:
            await http.respond(writer, 400, {"error": f"protocol {body.get('protocol')} is not {PROTOCOL_VERSION}"}, close=True)
            return
        lock = asyncio.Lock()
        stream = http.ChunkedWriter(writer)

        async def emit(action: Dict[str, Any]) -> None:
            async with lock:
                await stream.write((json.dumps(action) + "\n").encode())

        ctx = Context(body, emit)
        log.info("turn %s attempt %s key %s", ctx.exchange, ctx.attempt, ctx.idempotency_key)
        # A new attempt at a turn replaces one still running (its worker died).
        older = self._by_key.get(ctx.idempotency_key)
        if older in self._exchanges:
            log.info("exchange %s replaced by attempt %s", older, ctx.attempt)
            self._exchanges[older].task.cancel()
        await stream.start({"Content-Type": "application/x-ndjson"})
        task = asyncio.ensure_future(self._run(ctx, emit))
        self._exchanges[ctx.exchange] = _Exchange(ctx, task)
        self._by_key[ctx.idempotency_key] = ctx.exchange

        async def keepalive() -> None:
            try:
                while True:
                    await asyncio.sleep(self.keepalive_seconds)
                    await emit({"type": "keepalive"})
            finally:
                task.cancel()

        async def hangup() -> None:
            # The worker sends nothing more on this connection: its end (or reset) is the end
            # of the turn.
            try:
                await reader.read()
            finally:
                task.cancel()

        beat = asyncio.ensure_future(keepalive())
        watcher = asyncio.ensure_future(hangup())
        try:
            await asyncio.wait({task})
        finally:
            beat.cancel()
            watcher.cancel()
            self._exchanges.pop(ctx.exchange, None)
            if self._by_key.get(ctx.idempotency_key) == ctx.exchange:
                del self._by_key[ctx.idempotency_key]
            try:
                async with lock:
                    await stream.finish()
            except ConnectionError:
                pass

    async def _run(self, ctx: Context, emit) -> None:
        deadline = ctx.limits.get("deadline_ms")
        try:
            await asyncio.wait_for(self._handler(ctx), deadline / 1000 if deadline else None)
            await emit({"type": "done"})
        except asyncio.TimeoutError:
            log.warning("exchange %s ran past the turn's deadline", ctx.exchange)
        except Parked as e:
            log.info("exchange %s parked: %s", ctx.exchange, e.reason)
        except Refused as e:
            log.warning("exchange %s refused: %s", ctx.exchange, e)
        except asyncio.CancelledError:
            log.info("exchange %s stopped", ctx.exchange)
        except ConnectionError:
            log.info("exchange %s: the worker went away", ctx.exchange)
        except Exception as e:  # the handler failed: the turn fails with its message
            log.exception("exchange %s failed", ctx.exchange)
            try:
                await emit({"type": "error", "message": f"{type(e).__name__}: {e}"})
            except ConnectionError:
                pass
