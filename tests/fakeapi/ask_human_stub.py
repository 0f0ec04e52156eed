"""A stand-in ``ask_human`` stdio MCP server for real-CLI tests (``python -m tests.fakeapi.ask_human_stub``).

Why: the coders register an MCP server named ``ask_human`` per run; whether a real CLI loads it
and calls its tool unattended (no approval prompt in headless mode) can be tested before, and
independently of, the fleet's own server. This one answers at once with ``$FAKE_ANSWER`` and
appends each question as a JSON line to ``$FAKE_ASK_LOG``.
"""

from __future__ import annotations

import json
import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("ask_human")


@server.tool(structured_output=False)  # plain text: Claude shows structured output as JSON
def ask_human(question: str) -> str:
    """Ask the human operator a question and wait for the answer."""
    log = os.environ.get("FAKE_ASK_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps({"question": question}) + "\n")
    return os.environ.get("FAKE_ANSWER", "yes")


if __name__ == "__main__":
    server.run("stdio")
