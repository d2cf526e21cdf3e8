"""A streamable-HTTP MCP server (written with the `mcp` package's FastMCP) for the tests: `send`
is side-effecting and appends every call it starts to a ledger file (its arguments and the
idempotency key the client sent), then waits while the hold file exists; `peek` is read-only.

    ledger_server.py PORT LEDGER HOLD
"""

import asyncio
import json
import os
import sys

from mcp.server.fastmcp import Context, FastMCP
from mcp.types import ToolAnnotations

PORT, LEDGER, HOLD = int(sys.argv[1]), sys.argv[2], sys.argv[3]
server = FastMCP("ledger", host="127.0.0.1", port=PORT, stateless_http=True, log_level="WARNING")


@server.tool(annotations=ToolAnnotations(readOnlyHint=False))
async def send(to: str, ctx: Context) -> str:
    """Send a message to someone."""
    meta = ctx.request_context.meta
    extra = (meta.model_extra or {}) if meta is not None else {}
    with open(LEDGER, "a") as f:
        f.write(json.dumps({"to": to, "key": extra.get("turnpike/idempotency-key")}) + "\n")
    while os.path.exists(HOLD):
        await asyncio.sleep(0.02)
    return "sent to " + to


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def peek() -> str:
    """How many messages were sent."""
    try:
        with open(LEDGER) as f:
            return str(sum(1 for _ in f))
    except FileNotFoundError:
        return "0"


server.run(transport="streamable-http")
