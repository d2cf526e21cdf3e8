/**
 * Turnpike apps in TypeScript: `onReactiveEvent` handlers served over the remote app protocol.
 *
 * See `docs/remote-apps.md` in the Turnpike repository for the protocol.
 */

export {
  App,
  Cancelled,
  Context,
  Event,
  ModelReply,
  Parked,
  PROTOCOL_VERSION,
  Refused,
  ToolResult,
  WorkerGone,
} from "./app.js";
export type {
  AppOptions,
  Block,
  ChatMessage,
  Emit,
  Handler,
  JsonObject,
  Limits,
  ModelOptions,
  ToolCall,
  ToolSpec,
  Usage,
  WaitOptions,
} from "./app.js";
export type { Logger, LogLevel } from "./http.js";
export { stderrLogger } from "./http.js";
