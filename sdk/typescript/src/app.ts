/** The app, its per-turn context, and the HTTP server the worker calls. */

import { once } from "node:events";
import * as http from "node:http";

import {
  BadRequest,
  IDLE_SECONDS,
  MAX_HEADER_BYTES,
  bearerMatches,
  readBody,
  respond,
  stderrLogger,
  type Logger,
} from "./http.js";

export const PROTOCOL_VERSION = 2;

/** A JSON object as the protocol carries it (field names as on the wire). */
export type JsonObject = Record<string, unknown>;
/** A block of the record (`inputs`, `events`): `kind` and the kind's fields. */
export type Block = JsonObject & { kind: string };
export interface ToolCall {
  id: string;
  name: string;
  arguments: unknown;
}
export interface ChatMessage {
  role: "system" | "user" | "assistant" | "tool";
  content: string;
  tool_calls?: ToolCall[];
  tool_call_id?: string;
}
export interface ToolSpec {
  name: string;
  description: string;
  parameters: unknown;
}
export interface Limits {
  max_rounds: number;
  max_actions: number;
  max_bytes: number;
  max_line_bytes: number;
  read_timeout_ms: number;
  deadline_ms: number;
}
export interface Usage {
  prompt_tokens?: number;
  completion_tokens?: number;
}

/** The call parks the turn (an approval, a question); the handler should end. */
export class Parked extends Error {
  override name = "Parked";
  constructor(
    readonly callId: string,
    readonly reason: string,
  ) {
    super(`${callId}: ${reason}`);
  }
}

/** The worker refused an action of this handler; the turn fails with this reason. */
export class Refused extends Error {
  override name = "Refused";
}

/** The turn was taken from the handler (what `asyncio.CancelledError` is to the Python SDK):
 * `stop` (the user stopped it), `end` (the worker ended it), `replaced` (a new attempt at the
 * turn came), `hangup` (the worker's connection closed), `deadline` (the turn's deadline
 * passed), `ended` (the exchange is over: the handler returned). Every pending and later call
 * of the context rejects with it, and `ctx.signal` is aborted with it. */
export class Cancelled extends Error {
  override name = "Cancelled";
  /** Why: `stop`, `end`, `replaced`, `hangup`, `deadline` or `ended`. */
  constructor(readonly why: string) {
    super(`the turn was cancelled (${why})`);
  }
}

/** The worker's connection is gone: what was asked cannot be sent. */
export class WorkerGone extends Error {
  override name = "WorkerGone";
  constructor() {
    super("the worker's connection is closed");
  }
}

export class ToolResult {
  constructor(
    readonly ok: boolean,
    readonly output: unknown,
    readonly callId: string = "",
    readonly tool: string = "",
  ) {}
}

export class ModelReply {
  constructor(
    readonly text: string,
    readonly toolCalls: ToolCall[] = [],
    readonly usage: Usage | null = null,
  ) {}
}

/** Something the user sent while the turn runs: `kind` is the record's block kind
 * (`follow_up`, `steer`, `attachment`, ...). */
export class Event {
  constructor(
    readonly kind: string,
    readonly text: string,
    readonly block: Block,
  ) {}

  /** @internal */
  static of(block: unknown): Event {
    const b = (block ?? {}) as Block;
    return new Event(str(b.kind), str(b.text), b);
  }
}

export interface ModelOptions {
  /** Without them, the model sees the conversation as the built-in loop would send it. */
  messages?: Array<{ role: ChatMessage["role"]; content?: string }>;
  /** Offers the agent's tools (calls come back in `toolCalls`, not run). */
  tools?: boolean;
  /** Streams the model's text to the user as well. */
  say?: boolean;
  temperature?: number;
  maxTokens?: number;
}

export interface WaitOptions {
  /** Gives the wait up (JavaScript's form of cancelling it): it rejects with the signal's
   * reason, and what the worker takes for it afterwards goes to the next `nextEvent`. */
  signal?: AbortSignal;
}

export type Emit = (action: JsonObject) => Promise<void>;

interface Waiter {
  resolve: (message: JsonObject) => void;
  reject: (error: unknown) => void;
}

function str(value: unknown): string {
  return typeof value === "string" ? value : "";
}

function list<T>(value: unknown): T[] {
  return Array.isArray(value) ? (value as T[]) : [];
}

function obj(value: unknown): JsonObject {
  return value !== null && typeof value === "object" && !Array.isArray(value) ? (value as JsonObject) : {};
}

/** One turn, as a handler sees it. */
export class Context {
  readonly raw: JsonObject;
  readonly exchange: string;
  /** The same for every attempt at this turn: make your side effects idempotent with it. */
  readonly idempotencyKey: string;
  /** Differs per attempt (a worker that died mid-turn is replaced and the handler called again). */
  readonly attempt: string;
  readonly tenant: string;
  readonly conversation: string;
  readonly turn: string;
  readonly app: string;
  readonly agent: string;
  readonly identity: string;
  readonly systemPrompt: string;
  readonly inputs: Block[];
  readonly history: ChatMessage[];
  readonly tools: ToolSpec[];
  readonly limits: Partial<Limits>;
  /** Every event taken into this turn so far. */
  readonly events: Event[] = [];
  /** Aborted (with a `Cancelled`) when the turn is taken from the handler or is over: pass it
   * to timers and I/O the handler starts. */
  readonly signal: AbortSignal;

  private readonly emit: Emit;
  private readonly waiting = new Map<string, Waiter>();
  private readonly taken: Event[] = [];
  private readonly controller = new AbortController();
  private ids = 0;

  constructor(body: JsonObject, emit: Emit) {
    this.raw = body;
    this.exchange = str(body.exchange);
    this.idempotencyKey = str(body.idempotency_key);
    this.attempt = str(body.attempt);
    this.tenant = str(body.tenant);
    this.conversation = str(body.conversation);
    this.turn = body.turn === undefined || body.turn === null ? "" : String(body.turn);
    this.app = str(body.app);
    this.agent = str(body.agent);
    this.identity = str(body.identity);
    this.systemPrompt = str(body.system_prompt);
    this.inputs = list<Block>(body.inputs);
    this.history = list<ChatMessage>(body.history);
    this.tools = list<ToolSpec>(body.tools);
    this.limits = obj(body.limits) as Partial<Limits>;
    this.emit = emit;
    this.signal = this.controller.signal;
  }

  /** What the user said this turn (its message and follow-ups, one per line). */
  get text(): string {
    const kinds = ["user_message", "follow_up", "steer"];
    return this.inputs
      .filter((b) => kinds.includes(b.kind))
      .map((b) => str(b.text))
      .join("\n");
  }

  /** Results of calls that were answered (approved) before this turn called the app. */
  get resumed(): ToolResult[] {
    const calls = new Map<string, string>();
    for (const b of this.inputs) {
      if (b.kind === "tool_call") calls.set(String(b.call_id), str(b.tool));
    }
    for (const m of this.history) {
      for (const c of list<JsonObject>(m.tool_calls)) {
        const id = str(c.id);
        if (!calls.has(id)) calls.set(id, str(c.name));
      }
    }
    const out: ToolResult[] = [];
    for (const b of this.inputs) {
      if (b.kind === "tool_result") {
        const callId = str(b.call_id);
        out.push(new ToolResult(b.ok === true, b.output, callId, calls.get(callId) ?? ""));
      }
    }
    return out;
  }

  /** Files published this turn so far, as the record's `file` blocks. */
  files(): Block[] {
    return this.inputs.filter((b) => b.kind === "file");
  }

  private nextId(prefix: string): string {
    // Unique across turns and attempts: a retried turn's calls are new calls.
    this.ids += 1;
    return `${this.turn}-${this.attempt.slice(0, 8)}-${prefix}${this.ids}`;
  }

  private check(): void {
    if (this.signal.aborted) throw this.signal.reason;
  }

  /** Streams text to the user; consecutive calls make one reply. */
  async say(text: string): Promise<void> {
    this.check();
    if (text) await this.emit({ type: "say", text });
  }

  private async call(action: JsonObject & { id: string }, signal?: AbortSignal): Promise<JsonObject> {
    this.check();
    signal?.throwIfAborted();
    const id = action.id;
    const answer = new Promise<JsonObject>((resolve, reject) => {
      this.waiting.set(id, { resolve, reject });
    });
    answer.catch(() => {}); // rejected while the action is still being written: seen below
    const giveUp = (): void => {
      const waiter = this.waiting.get(id);
      this.waiting.delete(id);
      waiter?.reject(signal?.reason);
    };
    signal?.addEventListener("abort", giveUp, { once: true });
    try {
      await this.emit(action);
      return await answer;
    } finally {
      signal?.removeEventListener("abort", giveUp);
      this.waiting.delete(id);
    }
  }

  /** Calls one of the agent's tools; rejects with `Parked` when it waits for an approval. */
  async tool(name: string, args: JsonObject = {}): Promise<ToolResult> {
    const callId = this.nextId("t");
    const answer = await this.call({ type: "tool", id: callId, name, arguments: { ...args } });
    return new ToolResult(answer.ok === true, answer.output, callId, name);
  }

  /** Publishes a workspace file (writing `content` to it first when given). */
  async publish(path: string, content?: string): Promise<ToolResult> {
    if (content !== undefined) {
      const written = await this.tool("write_file", { path, content });
      if (!written.ok) return written;
    }
    const callId = this.nextId("p");
    const answer = await this.call({ type: "publish", id: callId, path });
    return new ToolResult(answer.ok === true, answer.output, callId, "publish");
  }

  /** Asks the user; the turn parks until they answer (this rejects with `Parked`). */
  async askUser(question: string): Promise<void> {
    const callId = this.nextId("q");
    await this.call({ type: "ask_user", id: callId, question });
  }

  /** Asks the deployment's model. Without `messages`, it sees the conversation as the
   * built-in loop would send it. `say: true` streams its text to the user as well. */
  async model(options: ModelOptions = {}): Promise<ModelReply> {
    const action: JsonObject & { id: string } = {
      type: "model",
      id: this.nextId("m"),
      tools: options.tools ?? false,
      say: options.say ?? false,
    };
    if (options.messages !== undefined) {
      action.messages = options.messages.map((m) => ({ role: m.role, content: m.content ?? "" }));
    }
    if (options.temperature !== undefined) action.temperature = options.temperature;
    if (options.maxTokens !== undefined) action.max_tokens = options.maxTokens;
    const answer = await this.call(action);
    return new ModelReply(
      str(answer.text),
      list<ToolCall>(answer.tool_calls),
      answer.usage === undefined || answer.usage === null ? null : (answer.usage as Usage),
    );
  }

  /** The next follow-up (or steer, attachment) the user sent during the turn; `null` after
   * `timeout` seconds (`undefined`/`null`: up to the turn's deadline).
   *
   * Events are taken into this turn only when asked for here: what the user sends that the
   * handler does not take before it returns starts the next turn, with its own reply. Give
   * the wait a bound with `timeout` (Turnpike ends it) rather than giving it up: an event
   * taken just as a given-up wait ends is this turn's, and is returned by the next call here,
   * or by none. To give a wait up, abort `options.signal` — never just stop awaiting it
   * (say, in a `Promise.race`): the wait would still take an event and drop it. */
  async nextEvent(timeout?: number | null, options: WaitOptions = {}): Promise<Event | null> {
    if (this.taken.length === 0) {
      const waitMs =
        timeout === undefined || timeout === null
          ? Math.trunc(Number(this.limits.deadline_ms ?? 600_000))
          : Math.max(0, Math.trunc(timeout * 1000));
      const answer = await this.call(
        { type: "next_events", id: this.nextId("e"), wait_ms: waitMs },
        options.signal,
      );
      for (const block of list<unknown>(answer.blocks)) this.take(Event.of(block));
    }
    return this.taken.shift() ?? null;
  }

  private take(event: Event): void {
    this.events.push(event);
    this.taken.push(event);
  }

  /** @internal A message of the worker for this turn. */
  _deliver(message: JsonObject): void {
    const kind = message.type;
    const waiter = this.waiting.get(str(message.id));
    if (kind === "events") {
      if (waiter !== undefined) {
        this.waiting.delete(str(message.id));
        waiter.resolve(message);
      } else {
        // The wait was given up (an aborted `nextEvent`): what it took is this turn's all
        // the same, so the next `nextEvent` gets it.
        for (const block of list<unknown>(message.blocks)) this.take(Event.of(block));
      }
    } else if (kind === "tool_result" || kind === "model_result") {
      if (waiter !== undefined) {
        this.waiting.delete(str(message.id));
        waiter.resolve(message);
      }
    } else if (kind === "parked") {
      if (waiter !== undefined) {
        this.waiting.delete(str(message.id));
        waiter.reject(new Parked(str(message.id), str(message.reason)));
      }
    } else if (kind === "refused") {
      const error = new Refused(str(message.message));
      for (const w of [...this.waiting.values()]) w.reject(error);
      this.waiting.clear();
    }
  }

  /** @internal Takes the turn from the handler: every wait and later call rejects. */
  _cancel(reason: Cancelled): void {
    if (this.signal.aborted) return;
    this.controller.abort(reason);
    for (const w of [...this.waiting.values()]) w.reject(reason);
    this.waiting.clear();
  }
}

export type Handler = (ctx: Context) => Promise<void> | void;

export interface AppOptions {
  /** The bearer secret the worker sends (`Authorization: Bearer …`); none: any caller. */
  secret?: string;
  /** The environment variable holding the secret (used when `secret` is not given; it must
   * be set). */
  secretEnv?: string;
  /** How often a keepalive is sent while the handler works (the worker's read timeout). */
  keepaliveSeconds?: number;
  /** Where the SDK logs; default: stderr. `null`: nowhere. */
  logger?: Logger | null;
}

interface Exchange {
  ctx: Context;
}

/** An app: one `onReactiveEvent` handler, served to Turnpike workers over HTTP. */
export class App {
  readonly secret: string | null;
  readonly keepaliveSeconds: number;
  private handler: Handler | null = null;
  private readonly exchanges = new Map<string, Exchange>();
  private readonly byKey = new Map<string, string>();
  private readonly log: Logger;
  private server: http.Server | null = null;

  constructor(options: AppOptions = {}) {
    let secret = options.secret;
    if (secret === undefined && options.secretEnv) {
      secret = process.env[options.secretEnv];
      if (secret === undefined) throw new Error(`the secret variable ${options.secretEnv} is not set`);
    }
    if (secret !== undefined && !secret) {
      throw new Error("the secret is empty: set one, or pass none to accept any caller");
    }
    this.secret = secret ?? null;
    this.keepaliveSeconds = options.keepaliveSeconds ?? 5;
    const logger = options.logger === undefined ? stderrLogger : options.logger;
    this.log = logger ?? (() => {});
  }

  /** Registers the turn handler; returns it. */
  onReactiveEvent(handler: Handler): Handler {
    this.handler = handler;
    return handler;
  }

  /** Serves until the process ends (a failure to listen is printed and exits 1). */
  run(host = "127.0.0.1", port = 8080): void {
    this.serve(host, port).catch((e: unknown) => {
      this.log("error", "cannot serve", e);
      process.exit(1);
    });
  }

  /** Serves on `host:port` (port 0: any free port, passed to `started`); resolves once
   * `close()` has stopped the server. */
  async serve(host = "127.0.0.1", port = 8080, started?: (port: number) => void): Promise<void> {
    if (this.handler === null) throw new Error("no handler: register one with app.onReactiveEvent");
    const server = http.createServer(
      {
        maxHeaderSize: MAX_HEADER_BYTES,
        keepAliveTimeout: IDLE_SECONDS * 1000,
        headersTimeout: IDLE_SECONDS * 1000,
        // Bodies are timed by `readBody`; the turn's response stream is never timed here.
        requestTimeout: 0,
      },
      (req, res) => this.request(req, res),
    );
    server.on("clientError", (error: NodeJS.ErrnoException, socket) => {
      if (error.code === "ECONNRESET" || !socket.writable || error.code === "ERR_HTTP_REQUEST_TIMEOUT") {
        socket.destroy();
        return;
      }
      const data = JSON.stringify({ error: error.message });
      socket.end(
        `HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n` +
          `Content-Length: ${Buffer.byteLength(data)}\r\nConnection: close\r\n\r\n${data}`,
      );
    });
    this.server = server;
    server.listen(port, host);
    await once(server, "listening");
    const address = server.address();
    const bound = typeof address === "object" && address !== null ? address.port : port;
    this.log("info", `serving on ${host}:${bound}`);
    started?.(bound);
    await once(server, "close");
  }

  /** Stops serving: running turns are cancelled and every connection closed. */
  async close(): Promise<void> {
    const server = this.server;
    if (server === null) return;
    this.server = null;
    for (const exchange of this.exchanges.values()) exchange.ctx._cancel(new Cancelled("hangup"));
    const closed = once(server, "close");
    server.close();
    server.closeAllConnections();
    await closed;
  }

  private authorized(req: http.IncomingMessage): boolean {
    if (this.secret === null) return true;
    return bearerMatches(req.headers.authorization, this.secret);
  }

  private request(req: http.IncomingMessage, res: http.ServerResponse): void {
    res.on("error", () => {});
    const path = (req.url ?? "").split("?", 1)[0] ?? "";
    // Nobody's body is read before they are known.
    const health = req.method === "GET" && path === "/healthz";
    if (!health && !this.authorized(req)) {
      respond(res, 401, { error: "unauthorized" }, true);
      return;
    }
    readBody(req)
      .then(
        (body) => this.route(req, res, path, body),
        (error: unknown) => {
          if (error instanceof BadRequest && !res.headersSent) respond(res, 400, { error: error.message }, true);
          else req.socket.destroy();
        },
      )
      .catch((error: unknown) => {
        this.log("warning", `a request failed: ${describe(error)}`);
        req.socket.destroy();
      });
  }

  private route(req: http.IncomingMessage, res: http.ServerResponse, path: string, raw: Buffer): void {
    if (req.method === "GET" && path === "/healthz") {
      respond(res, 200, { ok: true });
      return;
    }
    if (req.method !== "POST") {
      respond(res, 405, { error: "method not allowed" });
      return;
    }
    let body: unknown;
    try {
      body = JSON.parse(raw.length ? raw.toString("utf8") : "{}");
    } catch (e) {
      respond(res, 400, { error: `not JSON: ${(e as Error).message}` });
      return;
    }
    if (body === null || typeof body !== "object" || Array.isArray(body)) {
      respond(res, 400, { error: "the body must be a JSON object" });
      return;
    }
    if (path === "/v1/turns") {
      void this.turn(body as JsonObject, res);
      return;
    }
    const parts = path.replace(/^\/+|\/+$/g, "").split("/");
    if (parts.length === 4 && parts[0] === "v1" && parts[1] === "turns" && parts[3] === "messages") {
      const exchange = this.exchanges.get(parts[2] ?? "");
      if (exchange === undefined) {
        respond(res, 404, { error: "no such exchange" });
        return;
      }
      this.message(exchange, body as JsonObject);
      respond(res, 204, null);
      return;
    }
    respond(res, 404, { error: "not found" });
  }

  private message(exchange: Exchange, body: JsonObject): void {
    const kind = body.type;
    this.log("info", `exchange ${exchange.ctx.exchange}: ${String(kind)}`);
    if (kind === "stop" || kind === "end") exchange.ctx._cancel(new Cancelled(kind));
    else exchange.ctx._deliver(body);
  }

  private async turn(body: JsonObject, res: http.ServerResponse): Promise<void> {
    if (body.protocol !== PROTOCOL_VERSION) {
      const given = body.protocol === undefined ? "None" : JSON.stringify(body.protocol);
      respond(res, 400, { error: `protocol ${given} is not ${PROTOCOL_VERSION}` }, true);
      return;
    }
    // One writer at a time; a line is written whole, with the stream's backpressure.
    let chain: Promise<void> = Promise.resolve();
    let over = false;
    const write = async (data: string): Promise<void> => {
      if (over || res.destroyed || res.writableEnded) throw new WorkerGone();
      if (!res.write(data)) {
        const [drained] = await Promise.race([
          once(res, "drain").then(() => [true] as const),
          once(res, "close").then(() => [false] as const),
        ]);
        if (!drained) throw new WorkerGone();
      }
    };
    const emit: Emit = (action) => {
      const written = chain.then(() => write(JSON.stringify(action) + "\n"));
      chain = written.catch(() => {});
      return written;
    };

    const ctx = new Context(body, emit);
    this.log("info", `turn ${ctx.exchange} attempt ${ctx.attempt} key ${ctx.idempotencyKey}`);
    // A new attempt at a turn replaces one still running (its worker died).
    const older = this.byKey.get(ctx.idempotencyKey);
    if (older !== undefined && this.exchanges.has(older)) {
      this.log("info", `exchange ${older} replaced by attempt ${ctx.attempt}`);
      this.exchanges.get(older)?.ctx._cancel(new Cancelled("replaced"));
    }
    res.writeHead(200, { "Content-Type": "application/x-ndjson", Connection: "close" });
    res.flushHeaders();
    const exchange: Exchange = { ctx };
    this.exchanges.set(ctx.exchange, exchange);
    this.byKey.set(ctx.idempotencyKey, ctx.exchange);

    // The worker sends nothing more on this connection: its end (or reset) ends the turn.
    const hangup = (): void => {
      if (!over) ctx._cancel(new Cancelled("hangup"));
    };
    res.on("close", hangup);
    const beat = setInterval(() => {
      emit({ type: "keepalive" }).catch(() => ctx._cancel(new Cancelled("hangup")));
    }, this.keepaliveSeconds * 1000);

    try {
      await this.handle(ctx, emit);
    } finally {
      clearInterval(beat);
      if (this.exchanges.get(ctx.exchange) === exchange) this.exchanges.delete(ctx.exchange);
      if (this.byKey.get(ctx.idempotencyKey) === ctx.exchange) this.byKey.delete(ctx.idempotencyKey);
      await chain;
      over = true;
      res.off("close", hangup);
      // The exchange is forgotten: whatever the handler left running hears so.
      ctx._cancel(new Cancelled("ended"));
      if (!res.destroyed && !res.writableEnded) res.end();
    }
  }

  private async handle(ctx: Context, emit: Emit): Promise<void> {
    const handler = this.handler as Handler;
    const deadline = Number(ctx.limits.deadline_ms ?? 0);
    const timer = deadline
      ? setTimeout(() => ctx._cancel(new Cancelled("deadline")), Math.min(deadline, 2 ** 31 - 1))
      : undefined;
    // Taken from the handler (a stop, a new attempt, a hangup, the deadline): the turn is
    // over for the SDK at once, whatever the handler still awaits.
    const taken = new Promise<never>((_, reject) => {
      if (ctx.signal.aborted) reject(ctx.signal.reason);
      ctx.signal.addEventListener("abort", () => reject(ctx.signal.reason), { once: true });
    });
    taken.catch(() => {});
    try {
      const handled = Promise.resolve().then(() => handler(ctx));
      handled.catch(() => {});
      await Promise.race([handled, taken]);
      await emit({ type: "done" });
    } catch (e) {
      if (e instanceof Cancelled) {
        if (e.why === "deadline") this.log("warning", `exchange ${ctx.exchange} ran past the turn's deadline`);
        else this.log("info", `exchange ${ctx.exchange} stopped`);
      } else if (e instanceof Parked) {
        this.log("info", `exchange ${ctx.exchange} parked: ${e.reason}`);
      } else if (e instanceof Refused) {
        this.log("warning", `exchange ${ctx.exchange} refused: ${e.message}`);
      } else if (e instanceof WorkerGone) {
        this.log("info", `exchange ${ctx.exchange}: the worker went away`);
      } else {
        // The handler failed: the turn fails with its message.
        this.log("error", `exchange ${ctx.exchange} failed`, e);
        try {
          await emit({ type: "error", message: describe(e) });
        } catch {
          // the worker went away
        }
      }
    } finally {
      clearTimeout(timer);
    }
  }
}

/** `Name: message`, as the Python SDK reports a handler's exception. */
function describe(e: unknown): string {
  if (e instanceof Error) {
    const name = e.name && e.name !== "Error" ? e.name : e.constructor.name;
    return `${name}: ${e.message}`;
  }
  return `Error: ${String(e)}`;
}
