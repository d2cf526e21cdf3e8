"""A remote app for tests, on the Python SDK: it says one line, waits as long as the message
asks ("wait 120 ..." waits 120 ms), and returns without reading follow-ups. "patience 120 ..."
first waits up to 120 ms for an event around `next_event` and gives up (a cancelled wait),
then says its line.

Run: PYTHONPATH=sdk/python python3 tests/apps/hasty.py --port 0
"""

import argparse
import asyncio
import logging
import sys

from turnpike_app import App

app = App()


@app.on_reactive_event
async def handle(ctx):
    text = ctx.text.strip()
    words = text.split()
    if len(words) >= 2 and words[0] == "patience" and words[1].isdigit():
        try:
            await asyncio.wait_for(ctx.next_event(), int(words[1]) / 1000)
        except asyncio.TimeoutError:
            pass
    await ctx.say(f"got {text}")
    if len(words) >= 2 and words[0] == "wait" and words[1].isdigit():
        await asyncio.sleep(int(words[1]) / 1000)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    asyncio.run(app.serve("127.0.0.1", args.port))


if __name__ == "__main__":
    main()
