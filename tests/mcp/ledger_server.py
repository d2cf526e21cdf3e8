"""A streamable-HTTP MCP server (written with the `mcp` package's FastMCP) for the tests: `send`
is side-effecting and appends every call it starts to a ledger file (its arguments, the
idempotency key the client sent, and whose bearer token it carried), then waits while the hold
file exists; `peek` is read-only.

    ledger_server.py PORT LEDGER HOLD [TOKENS]

With TOKENS (a JSON object of bearer token -> user), every request must carry one of those
tokens (`401` otherwise), and the ledger names the user whose token a call carried.
"""

import asyncio
import json
import os
import sys

from mcp.server.fastmcp import Context, FastMCP
from mcp.types import ToolAnnotations

PORT, LEDGER, HOLD = int(sys.argv[1]), sys.argv[2], sys.argv[3]
TOKENS = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
server = FastMCP("ledger", host="127.0.0.1", port=PORT, stateless_http=True, log_level="WARNING")


@server.tool(annotations=ToolAnnotations(readOnlyHint=False))
async def send(to: str, ctx: Context) -> str:
    """Send a message to someone."""
    meta = ctx.request_context.meta
    extra = (meta.model_extra or {}) if meta is not None else {}
    request = ctx.request_context.request
    auth = request.headers.get("authorization", "") if request is not None else ""
    user = TOKENS.get(auth.removeprefix("Bearer "))
    with open(LEDGER, "a") as f:
        line = {"to": to, "key": extra.get("turnpike/idempotency-key"), "user": user}
        f.write(json.dumps(line) + "\n")
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


if not TOKENS:
    server.run(transport="streamable-http")
else:
    import uvicorn

    app = server.streamable_http_app()

    async def guarded(scope, receive, send):
        """Refuses an HTTP request without one of the tokens, before MCP sees it."""
        if scope["type"] == "http":
            auth = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            if auth.removeprefix("Bearer ") not in TOKENS:
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"a bearer token is required"})
                return
        await app(scope, receive, send)

    uvicorn.run(guarded, host="127.0.0.1", port=PORT, log_level="warning")
