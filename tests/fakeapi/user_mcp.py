"""A user's own MCP server for the real-CLI tests: ``python tests/fakeapi/user_mcp.py LOG``.

Why: issue 13 requires that an agent run by fleet-tui still sees the MCP servers its user
registered in the CLI's own config, and that calling one really runs it. This stdio server (the
standard library only, so it starts in milliseconds and a CLI that defers MCP tools lists it in
its first turn) offers one tool, ``lookup_fact``, answers it with ``FACT``, and appends every call
as a JSON line to the file named on its command line: the test's proof that the tool ran.
"""

from __future__ import annotations

import json
import sys

FACT = "The answer is 42."
TOOL = "lookup_fact"
VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")


def reply(msg_id: object, result: dict[str, object]) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg_id, "result": result}) + "\n")
    sys.stdout.flush()


def main() -> None:
    log = sys.argv[1]
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if not isinstance(msg, dict) or "id" not in msg:
            continue  # notifications
        method, params = msg.get("method"), msg.get("params") or {}
        if method == "initialize":
            v = params.get("protocolVersion")
            reply(msg["id"], {
                "protocolVersion": v if v in VERSIONS else VERSIONS[-1],
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": "facts", "version": "1"},
            })  # fmt: skip
        elif method == "tools/list":
            schema = {"type": "object", "properties": {"topic": {"type": "string"}}, "required": ["topic"]}
            reply(msg["id"], {"tools": [{
                "name": TOOL, "description": "Look up a fact about a topic.", "inputSchema": schema,
                "annotations": {"readOnlyHint": True},
            }]})  # fmt: skip
        elif method == "tools/call":
            with open(log, "a", encoding="utf-8") as f:
                f.write(json.dumps({"tool": params.get("name"), "arguments": params.get("arguments")}) + "\n")
            reply(msg["id"], {"content": [{"type": "text", "text": FACT}], "isError": False})
        elif method == "ping":
            reply(msg["id"], {})
        else:
            err = {"code": -32601, "message": f"method not found: {method}"}
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "error": err}) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
