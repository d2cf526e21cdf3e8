/** The HTTP side, on node:http: just what the protocol needs (limits, JSON answers, the log). */

import { createHash, timingSafeEqual } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";

export const MAX_HEADER_BYTES = 64 * 1024;
export const MAX_BODY_BYTES = 64 * 1024 * 1024;
/** The longest a connection may sit idle before its next request (a pooled connection of the
 * worker is reused within this). */
export const IDLE_SECONDS = 120;
/** The longest a request's body may take to arrive once its headers are in. */
export const READ_SECONDS = 30;

export class BadRequest extends Error {
  override name = "BadRequest";
}

/** Reads a request's body, at most `limit` bytes, within `READ_SECONDS` (past it, the
 * connection is closed). Chunked and `Content-Length` framing are node:http's. */
export function readBody(req: IncomingMessage, limit: number = MAX_BODY_BYTES): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const declared = req.headers["content-length"];
    if (declared !== undefined && Number(declared) > limit) {
      reject(new BadRequest("the body is too large"));
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    let settled = false;
    const finish = (error: Error | null): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      if (error) reject(error);
      else resolve(Buffer.concat(chunks, size));
    };
    const timer = setTimeout(() => {
      finish(new Error("the request's body took too long"));
      req.socket.destroy();
    }, READ_SECONDS * 1000);
    req.on("data", (chunk: Buffer) => {
      if (settled) return;
      size += chunk.length;
      if (size > limit) {
        finish(new BadRequest("the body is too large"));
        return;
      }
      chunks.push(chunk);
    });
    req.on("end", () => finish(null));
    req.on("error", (e) => finish(e));
    req.on("aborted", () => finish(new Error("the request was aborted")));
  });
}

/** A whole response; `body` is sent as JSON (`null`: no body). */
export function respond(res: ServerResponse, status: number, body: unknown, close = false): void {
  const data = body === null ? Buffer.alloc(0) : Buffer.from(JSON.stringify(body));
  const headers: Record<string, string | number> = {};
  if (body !== null) headers["Content-Type"] = "application/json";
  if (status !== 204) headers["Content-Length"] = data.length;
  if (close) headers["Connection"] = "close";
  res.writeHead(status, headers);
  res.end(status === 204 ? undefined : data);
}

/** Whether the `Authorization` header is `Bearer <secret>`, compared in constant time (over
 * the raw header bytes against the secret's UTF-8, as the worker sends it). */
export function bearerMatches(given: string | undefined, secret: string): boolean {
  const digest = (bytes: Buffer): Buffer => createHash("sha256").update(bytes).digest();
  const a = Buffer.from(given ?? "", "latin1");
  const b = Buffer.from(`Bearer ${secret}`, "utf8");
  return timingSafeEqual(digest(a), digest(b)) && a.length === b.length;
}

export type LogLevel = "info" | "warning" | "error";
/** Where the SDK logs (`error` comes with the handler's exception). */
export type Logger = (level: LogLevel, message: string, error?: unknown) => void;

function asctime(now: Date): string {
  const p = (n: number, w = 2): string => String(n).padStart(w, "0");
  return (
    `${now.getFullYear()}-${p(now.getMonth() + 1)}-${p(now.getDate())} ` +
    `${p(now.getHours())}:${p(now.getMinutes())}:${p(now.getSeconds())},${p(now.getMilliseconds(), 3)}`
  );
}

/** The default log: stderr, one line a record, as the Python samples configure it
 * (`%(asctime)s turnpike_app %(message)s`); an exception's stack follows its line. */
export const stderrLogger: Logger = (level, message, error) => {
  let line = `${asctime(new Date())} turnpike_app ${message}\n`;
  if (level === "error" && error !== undefined) {
    const text = error instanceof Error ? (error.stack ?? `${error.name}: ${error.message}`) : String(error);
    line += `${text}\n`;
  }
  process.stderr.write(line);
};
