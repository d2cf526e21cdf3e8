"""A support bot written against Turnpike's remote app protocol with the Python SDK.

- "ticket: <subject>" opens a ticket: follow-ups sent while the turn runs are its details,
  "submit" files it: the model summarises it and the ticket is written to ticket.md, which
  needs an operator's approval (the turn parks until then); once approved, it is published.
- Anything else is answered by the deployment's model, streamed to the user.

Run: python3 app.py --port 9000   (SUPPORT_BOT_SECRET must match the worker's)
"""

import argparse
import asyncio
import logging
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sdk", "python"))

from turnpike_app import App  # noqa: E402

app = App(secret_env="SUPPORT_BOT_SECRET")


@app.on_reactive_event
async def handle(ctx):
    # After the operator approved writing the ticket: publish it (in this turn's workspace).
    written = [r for r in ctx.resumed if r.tool == "write_file"]
    if written:
        if not written[0].ok:
            await ctx.say(f"The ticket could not be written: {written[0].output}")
            return
        published = await ctx.publish(written[0].output["path"])
        if published.ok:
            await ctx.say(f"Your ticket is filed: {published.output['reference']}")
        else:
            await ctx.say(f"The ticket was not published: {published.output}")
        return
    text = ctx.text.strip()
    if not text.lower().startswith("ticket:"):
        await ctx.model(say=True)
        return
    subject = text.split(":", 1)[1].strip()
    await ctx.say(f"Opening a ticket about “{subject}”. Send details as follow-ups; say “submit” when done.")
    details = []
    while True:
        event = await ctx.next_event(timeout=600)
        if event is None:
            await ctx.say(" No details came; the ticket stays open.")
            return
        if event.text.strip().lower() == "submit":
            break
        details.append(event.text)
        await ctx.say(f"\nNoted: {event.text}")
    summary = await ctx.model(
        messages=[
            {"role": "system", "content": "Summarise this support ticket in one paragraph."},
            {"role": "user", "content": f"{subject}\n" + "\n".join(details)},
        ],
        say=True,
    )
    body = f"# {subject}\n\n{summary.text}\n\n## Details\n" + "".join(f"- {d}\n" for d in details)
    # Writing a ticket needs an operator's approval: this parks the turn (raising Parked);
    # the next turn, once approved, publishes it.
    await ctx.tool("write_file", path="ticket.md", content=body)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--port-file", help="write the bound port here (for --port 0)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)

    def started(port):
        if args.port_file:
            with open(args.port_file + ".tmp", "w") as f:
                f.write(str(port))
            os.replace(args.port_file + ".tmp", args.port_file)

    asyncio.run(app.serve(args.host, args.port, started))


if __name__ == "__main__":
    main()
