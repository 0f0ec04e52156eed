"""The lean ``ask_human`` stdio entry point: answers the MCP handshake at once, then relays.

Why it exists: importing the official ``mcp`` SDK takes 1-2 s on a busy machine, and an agent CLI
that defers MCP tools (Codex's ``tool_search``) only finds servers that have already answered
``initialize`` and ``tools/list``: a model that looks for ``ask_human`` in its first turn found
nothing and carried on without asking. This module imports nothing but the standard library, so
``python -m fleet_tui.scheduler.humans.mcp_stdio`` answers ``initialize`` (and ``tools/list`` and
``ping``) within tens of milliseconds, from the same constants the SDK server is built from.

Right after the ``initialize`` reply it starts the real server, ``python -m
fleet_tui.scheduler.humans.mcp_ask_human`` (the official SDK), as its child, replays the client's
``initialize`` request to it (dropping the duplicate reply) and from then on relays every line
both ways. Tool calls are always served by the SDK server; the lean side answers only the
handshake and, until the SDK server is ready, ``tools/list`` and ``ping``. A test pins that these
answers equal the SDK server's own. The SDK server writes questions straight into the fleet's
store, so a question survives an engine restart.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # not typing's: importing typing alone costs milliseconds at start-up
if TYPE_CHECKING:  # subprocess and threading are imported after the handshake reply
    import subprocess
    import threading
    from typing import IO, Any

SERVER_NAME = "ask_human"
TOOL_NAME = "ask_human"
INSTRUCTIONS = "Ask the person supervising this fleet-tui run a question."
#: the module that serves the tool with the official SDK (run as the relay's child)
SDK_SERVER_MODULE = "fleet_tui.scheduler.humans.mcp_ask_human"
#: protocol revisions negotiable through ``initialize`` (the SDK's HANDSHAKE_PROTOCOL_VERSIONS)
HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")

TOOL_DESCRIPTION = """Ask the person supervising this run a question and wait for the answer.

Use it only when you cannot go on well without a person: a decision that is theirs to make and
that you cannot infer from the task, the code or the docs (a product choice, a license, which of
several incompatible approaches); an action that needs a human, such as logging in, solving a
captcha, or a one-time code / 2FA prompt; or permission for something risky or irreversible.
Do not use it for things you can find out yourself, and do not ask for confirmation of routine
steps.

Never ask the person to type a password, token or other credential into the answer, and never
type credentials yourself: ask them to complete the login themselves, then tell you when done.

Put everything needed to decide in `question` (what you found, what you propose); give `options`
when the answer is a choice (the person must pick one; set `allow_free_text` when other answers
are fine too). The call blocks until someone answers, then returns their answer
as text. If nobody answers in time it returns a "no answer" message: then proceed with your best
judgement only if that is safe and reversible, otherwise stop and explain what you need."""

QUESTION_DESCRIPTION = "The question, with what the person needs to decide it."
OPTIONS_DESCRIPTION = "Possible answers when it is a choice; the person must pick one of them."
FREE_TEXT_DESCRIPTION = "With options: true when any other answer is fine too (they are suggestions)."
TOOL_TITLE = "Ask a human"

#: the ``tools/list`` entry, as the SDK server lists it
TOOL: dict[str, Any] = {
    "annotations": {
        "destructiveHint": False,
        "idempotentHint": False,
        "openWorldHint": True,
        "readOnlyHint": True,
        "title": TOOL_TITLE,
    },
    "description": TOOL_DESCRIPTION,
    "inputSchema": {
        "properties": {
            "question": {"description": QUESTION_DESCRIPTION, "title": "Question", "type": "string"},
            "options": {
                "anyOf": [{"items": {"type": "string"}, "type": "array"}, {"type": "null"}],
                "default": None,
                "description": OPTIONS_DESCRIPTION,
                "title": "Options",
            },
            "allow_free_text": {
                "default": False,
                "description": FREE_TEXT_DESCRIPTION,
                "title": "Allow Free Text",
                "type": "boolean",
            },
        },
        "required": ["question"],
        "type": "object",
        "title": "ask_humanArguments",
    },
    "name": TOOL_NAME,
    "title": TOOL_TITLE,
}


def initialize_result(requested: Any) -> dict[str, Any]:
    """The ``initialize`` result the SDK server gives a client asking for ``requested``."""
    version = requested if requested in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[-1]
    return {
        "capabilities": {
            "prompts": {"listChanged": False},
            "resources": {"listChanged": False, "subscribe": False},
            "tools": {"listChanged": False},
        },
        "instructions": INSTRUCTIONS,
        "protocolVersion": version,
        "serverInfo": {"name": SERVER_NAME, "version": ""},
    }


def tools_list_result() -> dict[str, Any]:
    return {"tools": [TOOL]}


# JSON without the json package: importing it pulls in re, enum and functools (tens of
# milliseconds on a busy machine, most of this entry point's start-up). CPython's C accelerator
# _json scans and escapes; json is imported only if _json is missing.


class _ScanContext:
    """What _json.make_scanner reads from a JSONDecoder."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = float
    memo: dict[str, str] = {}


try:
    import _json

    _scan = _json.make_scanner(_ScanContext())  # type: ignore[arg-type]
    _escape = _json.encode_basestring_ascii
except (ImportError, AttributeError):  # another Python: the json package does the same
    import json

    _scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
    _escape = json.encoder.encode_basestring_ascii


def loads(line: bytes) -> Any:
    """The JSON value of one line, or None when it is not exactly one JSON value."""
    try:
        text = line.decode("utf-8").strip()
        value, end = _scan(text, 0)
    except (StopIteration, ValueError, UnicodeDecodeError):
        return None
    return value if end == len(text) else None


def dumps(value: Any) -> str:
    """Compact JSON of dicts, lists, strings, numbers, booleans and None."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return str(_escape(value))
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return float.__repr__(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{_escape(str(k))}:{dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    raise TypeError(f"not JSON: {type(value).__name__}")


def _encode(obj: Any) -> bytes:
    return dumps(obj).encode("utf-8") + b"\n"


class Relay:
    """Answers the handshake itself, runs the SDK server as a child, relays lines both ways."""

    def __init__(
        self, stdin: IO[bytes], stdout: IO[bytes], child_argv: list[str], env: dict[str, str] | None = None
    ) -> None:
        self.stdin, self.stdout = stdin, stdout
        self.child_argv = child_argv
        self.env = env
        self.child: subprocess.Popen[bytes] | None = None
        self._init_id: Any = None
        #: set once the child runs: stdout is then written from two threads
        self._out_lock: threading.Lock | None = None
        #: the SDK server answered the replayed initialize: it serves everything from now on
        self.ready: threading.Event | None = None
        self._pump: threading.Thread | None = None
        #: end this process when the SDK server ends (False only when embedded, e.g. in tests)
        self.exit_with_child = True

    def write(self, data: bytes) -> None:
        if self._out_lock is None:
            self.stdout.write(data)
            self.stdout.flush()
            return
        with self._out_lock:
            self.stdout.write(data)
            self.stdout.flush()

    def is_ready(self) -> bool:
        return self.ready is not None and self.ready.is_set()

    def reply(self, msg_id: Any, result: dict[str, Any]) -> None:
        self.write(_encode({"jsonrpc": "2.0", "id": msg_id, "result": result}))

    def start_child(self, first: bytes | None) -> subprocess.Popen[bytes]:
        if self.child is None:
            import subprocess
            import threading

            self._out_lock = threading.Lock()
            self.ready = threading.Event()
            self.child = subprocess.Popen(
                self.child_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env
            )
            if first is not None:
                self._send(first)
            else:
                self.ready.set()
            self._pump = threading.Thread(target=self._pump_out, name="ask-human-out", daemon=True)
            self._pump.start()
        return self.child

    def _send(self, line: bytes) -> None:
        child = self.child
        assert child is not None and child.stdin is not None
        try:
            child.stdin.write(line if line.endswith(b"\n") else line + b"\n")
            child.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # the SDK server is gone; its exit ends the relay

    def _pump_out(self) -> None:
        child = self.child
        assert child is not None and child.stdout is not None
        assert self.ready is not None
        for line in iter(child.stdout.readline, b""):
            if not self.ready.is_set() and self._is_init_reply(line):
                self.ready.set()
                continue
            self.write(line)
        # the SDK server is gone (the client closed stdin, or it failed): so is this server, at
        # once, so that no client waits on a request nobody will answer
        code = child.wait()
        if self.exit_with_child:
            os._exit(code if code >= 0 else 1)

    def _is_init_reply(self, line: bytes) -> bool:
        msg = loads(line)
        return isinstance(msg, dict) and "method" not in msg and msg.get("id") == self._init_id

    def handle(self, line: bytes) -> None:
        """One line from the client."""
        parsed = loads(line)
        msg: dict[str, Any] = parsed if isinstance(parsed, dict) else {}
        method = msg.get("method")
        has_id = "id" in msg
        if self.child is None and method == "initialize" and has_id:
            params = msg.get("params")
            requested = params.get("protocolVersion") if isinstance(params, dict) else None
            self._init_id = msg["id"]
            self.reply(msg["id"], initialize_result(requested))
            self.start_child(line)
            return
        if has_id and self.child is not None and not self.is_ready():
            if method == "tools/list":
                self.reply(msg["id"], tools_list_result())
                return
            if method == "ping":
                self.reply(msg["id"], {})
                return
        self.start_child(None)
        self._send(line)

    def run(self) -> int:
        for line in iter(self.stdin.readline, b""):
            if line.strip():
                self.handle(line)
        child = self.child
        if child is None:
            return 0
        if child.stdin is not None:
            try:
                child.stdin.close()
            except OSError:
                pass
        code = child.wait()
        if self._pump is not None:
            self._pump.join(timeout=5)
        return code


def command(python: str = sys.executable) -> tuple[str, ...]:
    """The argv that starts this entry point fast: isolated (-I) and without site (-S), by path.

    It needs only the standard library; the SDK server it starts runs with the normal site.
    """
    return (python, "-I", "-S", os.path.abspath(__file__))


def main() -> int:
    child = [sys.executable, "-m", SDK_SERVER_MODULE]
    relay = Relay(sys.stdin.buffer, sys.stdout.buffer, child, dict(os.environ))
    try:
        return relay.run()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
