// A self-check, after `npm run build` here and in examples/support_bot_ts: plays the worker
// against the sample app (started as the Rust tests start the Python one) and against small
// in-process apps on the SDK. Run: node test/smoke.mjs
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import http from "node:http";
import { dirname, join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";

import { App, Cancelled } from "../dist/index.js";

const here = dirname(fileURLToPath(import.meta.url));
const sample = join(here, "..", "..", "..", "examples", "support_bot_ts", "dist", "app.js");
const SECRET = "s3cret-for-the-support-bot";
const ID = /^[A-Za-z0-9_-]{1,64}$/;
const agent = new http.Agent({ keepAlive: true });

// ---- the worker's side of the protocol ----------------------------------------------------

function headers(exchange, key, secret) {
  const h = {
    "Content-Type": "application/json",
    "Turnpike-Protocol": "2",
    "Turnpike-Exchange": exchange,
    "Idempotency-Key": key,
  };
  if (secret !== null) h.Authorization = `Bearer ${secret}`;
  return h;
}

/** One whole request: { status, body }. */
function request(port, method, path, body, hdrs = {}) {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? "" : JSON.stringify(body);
    const req = http.request(
      { host: "127.0.0.1", port, method, path, agent, headers: { ...hdrs, "Content-Length": Buffer.byteLength(data) } },
      (res) => {
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (c) => (text += c));
        res.on("end", () => resolve({ status: res.statusCode, body: text ? JSON.parse(text) : null }));
      },
    );
    req.on("error", reject);
    req.end(data);
  });
}

function context(port, { conversation = "conv_smoke", turn = "turn_1", attempt = "9f3a1c2e77", inputs, history = [], limits = {} }) {
  const exchange = `${conversation}.${turn}.${attempt}`;
  const key = `default/${conversation}/${turn}`;
  return {
    exchange,
    key,
    body: {
      protocol: 2, exchange, idempotency_key: key, attempt, tenant: "default", conversation, turn,
      app: "support", agent: "bot", identity: "local:alice", system_prompt: "", history, inputs,
      tools: [],
      limits: { max_rounds: 8, max_actions: 1000, max_bytes: 4194304, max_line_bytes: 1048576,
                read_timeout_ms: 30000, deadline_ms: 600000, ...limits },
    },
  };
}

/** Opens a turn: `next()` is the next action (keepalives counted, not returned), `null` at
 * the stream's end; `send(message)` posts to /messages. */
async function openTurn(port, ctx, secret = SECRET) {
  const res = await new Promise((resolve, reject) => {
    const data = JSON.stringify(ctx.body);
    const req = http.request(
      { host: "127.0.0.1", port, method: "POST", path: "/v1/turns",
        headers: { ...headers(ctx.exchange, ctx.key, secret), "Content-Length": Buffer.byteLength(data) } },
      resolve,
    );
    req.on("error", reject);
    req.end(data);
  });
  assert.equal(res.statusCode, 200);
  assert.equal(res.headers["content-type"], "application/x-ndjson");
  const lines = [];
  const waiters = [];
  let buf = "";
  let ended = false;
  const wake = () => { while (waiters.length) waiters.shift()(); };
  res.setEncoding("utf8");
  res.on("data", (c) => {
    buf += c;
    let at;
    while ((at = buf.indexOf("\n")) >= 0) {
      lines.push(JSON.parse(buf.slice(0, at)));
      buf = buf.slice(at + 1);
    }
    wake();
  });
  res.on("end", () => { ended = true; wake(); });
  res.on("error", () => { ended = true; wake(); });
  const turn = {
    keepalives: 0,
    all: [],
    async next(timeoutMs = 10000) {
      const until = Date.now() + timeoutMs;
      for (;;) {
        while (lines.length) {
          const action = lines.shift();
          if (action.type === "keepalive") { turn.keepalives += 1; continue; }
          turn.all.push(action);
          for (const k of ["id"]) if (k in action) assert.match(action[k], ID);
          return action;
        }
        if (ended) return null;
        const left = until - Date.now();
        assert.ok(left > 0, `no action within ${timeoutMs} ms`);
        await Promise.race([new Promise((r) => waiters.push(r)), sleep(left)]);
      }
    },
    async expect(type, fields = {}) {
      const action = await turn.next();
      assert.ok(action, `expected ${type}, the stream ended`);
      assert.equal(action.type, type, JSON.stringify(action));
      for (const [k, v] of Object.entries(fields)) assert.deepEqual(action[k], v, `${type}.${k}`);
      return action;
    },
    async send(message) {
      const r = await request(port, "POST", `/v1/turns/${ctx.exchange}/messages`, message, headers(ctx.exchange, ctx.key, secret));
      return r;
    },
    close() { res.destroy(); },
  };
  return turn;
}

// ---- the sample app, as the Rust tests run it -----------------------------------------------

function startSample() {
  // SMOKE_APP="python3 …/examples/support_bot/app.py": the same checks against another sample.
  const [command, ...args] = process.env.SMOKE_APP ? process.env.SMOKE_APP.split(" ") : [process.execPath, sample];
  const child = spawn(command, [...args, "--port", "0"], {
    env: { ...process.env, SUPPORT_BOT_SECRET: SECRET, PYTHONDONTWRITEBYTECODE: "1" },
    stdio: ["ignore", "ignore", "pipe"],
  });
  const lines = [];
  let partial = "";
  child.stderr.setEncoding("utf8");
  child.stderr.on("data", (c) => {
    partial += c;
    const parts = partial.split("\n");
    partial = parts.pop();
    lines.push(...parts);
  });
  const waitLine = async (needle, timeoutMs = 10000) => {
    const until = Date.now() + timeoutMs;
    for (;;) {
      const found = lines.find((l) => l.includes(needle));
      if (found) return found;
      assert.ok(Date.now() < until, `no stderr line with ${needle}; got:\n${lines.join("\n")}`);
      await sleep(20);
    }
  };
  return { child, lines, waitLine };
}

const step = (name) => process.stdout.write(`- ${name}\n`);

async function sampleChecks() {
  const app = startSample();
  try {
    const line = await app.waitLine("serving on");
    const port = Number(line.split(":").pop().trim());
    assert.ok(port > 0, line);
    step(`the sample serves: ${line}`);

    assert.deepEqual(await request(port, "GET", "/healthz"), { status: 200, body: { ok: true } });
    const unauth = await request(port, "POST", "/v1/turns", {}, {});
    assert.equal(unauth.status, 401);
    const wrong = await request(port, "POST", "/v1/turns", {}, { Authorization: "Bearer nope" });
    assert.equal(wrong.status, 401);
    const v1 = await request(port, "POST", "/v1/turns", { protocol: 1 }, headers("x", "k", SECRET));
    assert.equal(v1.status, 400);
    assert.match(v1.body.error, /protocol 1 is not 2/);
    assert.equal((await request(port, "GET", "/v1/turns", undefined, headers("x", "k", SECRET))).status, 405);
    assert.equal((await request(port, "POST", "/nope", {}, headers("x", "k", SECRET))).status, 404);
    step("health, bearer secret, protocol version, methods");

    // Turn 1: a ticket, two follow-ups taken with next_events, the model, a gated write.
    const c1 = context(port, { inputs: [{ kind: "user_message", text: "ticket: printer on fire" }] });
    const t1 = await openTurn(port, c1);
    await t1.expect("say", { text: "Opening a ticket about “printer on fire”. Send details as follow-ups; say “submit” when done." });
    let ask = await t1.expect("next_events", { wait_ms: 600000 });
    assert.match(ask.id, /^turn_1-9f3a1c2e-e\d+$/);
    assert.equal((await t1.send({ type: "events", id: ask.id, blocks: [{ kind: "follow_up", text: "It smokes" }] })).status, 204);
    await t1.expect("say", { text: "\nNoted: It smokes" });
    ask = await t1.expect("next_events");
    await t1.send({ type: "events", id: ask.id, blocks: [{ kind: "follow_up", text: "submit" }] });
    const model = await t1.expect("model", {
      tools: false,
      say: true,
      messages: [
        { role: "system", content: "Summarise this support ticket in one paragraph." },
        { role: "user", content: "printer on fire\nIt smokes" },
      ],
    });
    await t1.send({ type: "model_result", id: model.id, text: "Summary: printer on fire", tool_calls: [] });
    const write = await t1.expect("tool", {
      name: "write_file",
      arguments: { path: "ticket.md", content: "# printer on fire\n\nSummary: printer on fire\n\n## Details\n- It smokes\n" },
    });
    await t1.send({ type: "parked", id: write.id, reason: "waits for an approval" });
    assert.equal(await t1.next(), null, "nothing after parked (no done)");
    await app.waitLine(`exchange ${c1.exchange} parked`);
    const late = await t1.send({ type: "end", outcome: "parked" });
    assert.deepEqual(late, { status: 404, body: { error: "no such exchange" } });
    const ids = t1.all.filter((a) => a.id).map((a) => a.id);
    assert.equal(new Set(ids).size, ids.length, "ids unique");
    step("turn 1: say, next_events x2, model, tool (parked), then 404 no such exchange");

    // Turn 2: after the approval, the result is in `inputs`; the app publishes the file.
    const c2 = context(port, {
      turn: "turn_2",
      attempt: "0b1c2d3e4f",
      inputs: [
        { kind: "tool_call", call_id: write.id, tool: "write_file", arguments: write.arguments },
        { kind: "tool_result", call_id: write.id, ok: true, output: { path: "ticket.md" } },
      ],
    });
    const t2 = await openTurn(port, c2);
    const publish = await t2.expect("publish", { path: "ticket.md" });
    assert.match(publish.id, /^turn_2-0b1c2d3e-p\d+$/);
    await t2.send({ type: "tool_result", id: publish.id, ok: true, output: { reference: "conv:fi:abc123" } });
    await t2.expect("say", { text: "Your ticket is filed: conv:fi:abc123" });
    await t2.expect("done");
    assert.equal(await t2.next(), null);
    step("turn 2: resumed write_file -> publish (tool_result) -> say -> done");

    // Turn 3: anything else goes to the model, streamed.
    const c3 = context(port, { turn: "turn_3", inputs: [{ kind: "user_message", text: "hello there" }] });
    const t3 = await openTurn(port, c3);
    const m3 = await t3.expect("model", { tools: false, say: true });
    assert.ok(!("messages" in m3));
    await t3.send({ type: "model_result", id: m3.id, text: "Summary: hello there", tool_calls: [], usage: { prompt_tokens: 3 } });
    await t3.expect("done");
    step("turn 3: model(say) -> done");

    // A stop mid-turn: the handler is cancelled, the stream ends, the app logs "stopped".
    const c4 = context(port, { conversation: "conv_stop", inputs: [{ kind: "user_message", text: "ticket: lost badge" }] });
    const t4 = await openTurn(port, c4);
    await t4.expect("say");
    await t4.expect("next_events");
    assert.equal((await t4.send({ type: "stop" })).status, 204);
    assert.equal(await t4.next(), null);
    assert.ok((await app.waitLine("stopped")).includes("conv_stop"));
    step("stop: the stream ends, 'exchange … stopped' logged");

    // A new attempt (same key) replaces the running one.
    const c5 = context(port, { conversation: "conv_retry", inputs: [{ kind: "user_message", text: "ticket: broken chair" }] });
    const c6 = context(port, { conversation: "conv_retry", attempt: "77aa88bb99", inputs: c5.body.inputs });
    const t5 = await openTurn(port, c5);
    await t5.expect("say");
    await t5.expect("next_events");
    const t6 = await openTurn(port, c6);
    assert.equal(await t5.next(), null, "the older attempt's stream ends");
    await t6.expect("say");
    const ask6 = await t6.expect("next_events");
    assert.match(ask6.id, /^turn_1-77aa88bb-e\d+$/);
    await app.waitLine(`exchange ${c5.exchange} replaced by attempt 77aa88bb99`);
    const keyLines = app.lines.filter((l) => l.endsWith("key default/conv_retry/turn_1"));
    assert.equal(keyLines.length, 2);
    // The worker hangs up: the handler is cancelled.
    t6.close();
    await app.waitLine(`exchange ${c6.exchange} stopped`);
    step("a second attempt replaces the first; a hangup cancels the handler");
  } finally {
    app.child.kill();
  }
}

// ---- SDK behaviour, with small in-process apps ---------------------------------------------

async function inProcess(handler, options = {}) {
  const app = new App({ logger: null, ...options });
  app.onReactiveEvent(handler);
  const port = await new Promise((resolve) => {
    app.serve("127.0.0.1", 0, resolve);
  });
  return { app, port };
}

async function sdkChecks() {
  // Keepalives while the handler works; ctx.signal for its own timers.
  {
    const { app, port } = await inProcess(async (ctx) => {
      await sleep(700, undefined, { signal: ctx.signal });
      await ctx.say("woke");
    }, { keepaliveSeconds: 0.2 });
    const t = await openTurn(port, context(port, { inputs: [] }), null);
    await t.expect("say", { text: "woke" });
    await t.expect("done");
    assert.ok(t.keepalives >= 2, `keepalives: ${t.keepalives}`);
    await app.close();
    step(`keepalives (${t.keepalives} in 0.7 s)`);
  }
  // A given-up wait (aborted signal): what it took later goes to the next nextEvent.
  {
    const { app, port } = await inProcess(async (ctx) => {
      try {
        await ctx.nextEvent(null, { signal: AbortSignal.timeout(100) });
        await ctx.say("unexpected");
      } catch (e) {
        assert.equal(e.name, "TimeoutError");
      }
      await ctx.say("gave up");
      const event = await ctx.nextEvent(5);
      await ctx.say(`event ${event?.text} ${ctx.events.length}`);
    });
    const t = await openTurn(port, context(port, { inputs: [] }), null);
    const first = await t.expect("next_events");
    await t.expect("say", { text: "gave up" });
    await t.send({ type: "events", id: first.id, blocks: [{ kind: "follow_up", text: "x" }] });
    let action = await t.next();
    if (action.type === "next_events") {
      await t.send({ type: "events", id: action.id, blocks: [] });
      action = await t.next();
    }
    assert.deepEqual(action, { type: "say", text: "event x 1" });
    await t.expect("done");
    await app.close();
    step("a given-up wait's events reach the next nextEvent");
  }
  // A failing handler: `error` with its message; a refusal; the deadline.
  {
    let seen = null;
    const { app, port } = await inProcess(async (ctx) => {
      if (ctx.text === "fail") throw new TypeError("boom");
      if (ctx.text === "refuse") {
        try {
          await ctx.tool("read_file", { path: "a" });
        } catch (e) {
          seen = e.name;
          throw e;
        }
      }
      if (ctx.text === "slow") await sleep(5000, undefined, { signal: ctx.signal });
    });
    let t = await openTurn(port, context(port, { inputs: [{ kind: "user_message", text: "fail" }] }), null);
    await t.expect("error", { message: "TypeError: boom" });
    assert.equal(await t.next(), null);
    t = await openTurn(port, context(port, { turn: "turn_2", inputs: [{ kind: "user_message", text: "refuse" }] }), null);
    await t.expect("tool", { name: "read_file", arguments: { path: "a" } });
    await t.send({ type: "refused", message: "max rounds" });
    assert.equal(await t.next(), null);
    assert.equal(seen, "Refused");
    t = await openTurn(port, context(port, { turn: "turn_3", inputs: [{ kind: "user_message", text: "slow" }], limits: { deadline_ms: 200 } }), null);
    const started = Date.now();
    assert.equal(await t.next(), null);
    assert.ok(Date.now() - started < 2000);
    await app.close();
    step("error action, Refused, deadline");
  }
  assert.ok(new Cancelled("stop") instanceof Error);
}

await sampleChecks();
await sdkChecks();
agent.destroy();
process.stdout.write("smoke: ok\n");
