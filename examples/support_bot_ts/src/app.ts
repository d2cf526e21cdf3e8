/**
 * A support bot written against Turnpike's remote app protocol with the TypeScript SDK
 * (the port of examples/support_bot/app.py; same manifest: ../support_bot/support.toml).
 *
 * - "ticket: <subject>" opens a ticket: follow-ups sent while the turn runs are its details,
 *   "submit" files it: the model summarises it and the ticket is written to ticket.md, which
 *   needs an operator's approval (the turn parks until then); once approved, it is published.
 * - Anything else is answered by the deployment's model, streamed to the user.
 *
 * Run: node dist/app.js --port 9000   (SUPPORT_BOT_SECRET must match the worker's)
 */

import { renameSync, writeFileSync } from "node:fs";
import { parseArgs } from "node:util";

import { App, type Context } from "turnpike-app";

const app = new App({ secretEnv: "SUPPORT_BOT_SECRET" });

app.onReactiveEvent(async (ctx: Context) => {
  // After the operator approved writing the ticket: publish it (in this turn's workspace).
  const written = ctx.resumed.filter((r) => r.tool === "write_file");
  const first = written[0];
  if (first !== undefined) {
    if (!first.ok) {
      await ctx.say(`The ticket could not be written: ${show(first.output)}`);
      return;
    }
    const published = await ctx.publish(String(field(first.output, "path")));
    if (published.ok) {
      await ctx.say(`Your ticket is filed: ${String(field(published.output, "reference"))}`);
    } else {
      await ctx.say(`The ticket was not published: ${show(published.output)}`);
    }
    return;
  }
  const text = ctx.text.trim();
  if (!text.toLowerCase().startsWith("ticket:")) {
    await ctx.model({ say: true });
    return;
  }
  const subject = text.slice(text.indexOf(":") + 1).trim();
  await ctx.say(`Opening a ticket about “${subject}”. Send details as follow-ups; say “submit” when done.`);
  const details: string[] = [];
  for (;;) {
    const event = await ctx.nextEvent(600);
    if (event === null) {
      await ctx.say(" No details came; the ticket stays open.");
      return;
    }
    if (event.text.trim().toLowerCase() === "submit") break;
    details.push(event.text);
    await ctx.say(`\nNoted: ${event.text}`);
  }
  const summary = await ctx.model({
    messages: [
      { role: "system", content: "Summarise this support ticket in one paragraph." },
      { role: "user", content: `${subject}\n` + details.join("\n") },
    ],
    say: true,
  });
  const body = `# ${subject}\n\n${summary.text}\n\n## Details\n` + details.map((d) => `- ${d}\n`).join("");
  // Writing a ticket needs an operator's approval: this parks the turn (rejecting with
  // Parked, which ends the handler quietly); the next turn, once approved, publishes it.
  await ctx.tool("write_file", { path: "ticket.md", content: body });
});

/** A field of a tool's JSON output (`output["path"]` in the Python sample). */
function field(output: unknown, name: string): unknown {
  if (output !== null && typeof output === "object" && name in output) {
    return (output as Record<string, unknown>)[name];
  }
  throw new TypeError(`the tool's output has no ${name}: ${show(output)}`);
}

function show(value: unknown): string {
  return typeof value === "string" ? value : JSON.stringify(value);
}

function main(): void {
  const { values } = parseArgs({
    options: {
      host: { type: "string", default: "127.0.0.1" },
      port: { type: "string", default: "9000" },
      "port-file": { type: "string" },
    },
  });
  const port = Number(values.port);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    process.stderr.write(`app.js: error: argument --port: invalid int value: '${values.port}'\n`);
    process.exit(2);
  }
  const portFile = values["port-file"];
  const started = (bound: number): void => {
    if (portFile) {
      writeFileSync(`${portFile}.tmp`, String(bound));
      renameSync(`${portFile}.tmp`, portFile);
    }
  };
  app.serve(values.host, port, started).catch((e: unknown) => {
    process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
    process.exit(1);
  });
}

main();
