"""An MCP server over stdio that misbehaves on purpose, for the tests of how Turnpike bounds
bad servers. Plain JSON-RPC lines, no dependencies (it runs in a cell with the host's Python).

    bad_server.py MODE

MODE: crash (exits when a tool is called), hang (never answers a call), garbage (answers a
call with lines that are not JSON-RPC), flood (answers a call with one line of 8 MiB), many
(lists 300 tools), twice (lists one tool twice), silent (never answers `initialize`), exit (writes a reason to stderr and
exits at once), fine (a well-behaved `echo` tool).
"""

import json
import sys

MODE = sys.argv[1] if len(sys.argv) > 1 else "fine"


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def tool(name):
    return {
        "name": name,
        "description": "echoes its text",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
        "annotations": {"readOnlyHint": True},
    }


if MODE == "exit":
    sys.stderr.write("bad_server: cannot open its configuration\n")
    sys.exit(3)

for line in sys.stdin:
    try:
        request = json.loads(line)
    except ValueError:
        continue
    method, rid = request.get("method"), request.get("id")
    if rid is None:
        continue  # a notification
    if method == "initialize":
        if MODE == "silent":
            continue
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": request["params"].get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "bad", "version": "1"},
        }})
    elif method == "tools/list":
        if MODE == "many":
            names = ["t%d" % i for i in range(300)]
        elif MODE == "twice":
            names = ["echo", "echo"]
        else:
            names = ["echo"]
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": [tool(n) for n in names]}})
    elif method == "tools/call":
        if MODE == "crash":
            sys.exit(1)
        if MODE == "hang":
            continue
        if MODE == "garbage":
            sys.stdout.write("this is not json\n{\"jsonrpc\": \"2.0\", \"id\": \"nobody\"}\n")
            sys.stdout.flush()
            continue
        if MODE == "flood":
            sys.stdout.write("x" * (8 << 20) + "\n")
            sys.stdout.flush()
            continue
        text = request["params"].get("arguments", {}).get("text", "")
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "content": [{"type": "text", "text": "echo: " + text}], "isError": False}})
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no such method"}})
