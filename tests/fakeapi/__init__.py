"""Scripted fake model APIs on loopback, so real agent CLIs can be tested without a real model.

Why: the coders' real-CLI tests (and later the engine's end-to-end tests) must drive the actual
``claude`` / ``codex`` / ``opencode`` programs through whole runs — tool calls, 429s, auth
failures — deterministically and offline. Each fake server answers the vendor's wire protocol
from a *script*: a list of turns, consumed one per model request. Every request is recorded so a
test can assert what the CLI sent (for example the ``tool_result`` it returned to the model).

This module holds what the vendor servers share: the turn types, the recorder and a threaded
stdlib HTTP server. ``anthropic.py`` and ``openai_responses.py`` speak the two protocols.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "HttpError",
    "Recorder",
    "Request",
    "Script",
    "Text",
    "ToolCall",
    "Turn",
]


@dataclass(frozen=True)
class Text:
    """The model answers with plain text and ends its turn."""

    text: str
    input_tokens: int | None = None  # None: estimated from the request size
    output_tokens: int | None = None
    #: send the text in chunks of this many characters (one SSE delta each)
    chunk: int = 40


@dataclass(frozen=True)
class ToolCall:
    """The model calls a tool (by the name the CLI advertised) with ``input``.

    ``text`` is an optional sentence the model says before the call.
    """

    name: str
    input: dict[str, Any]
    text: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    #: Responses API only: the tool's namespace (Codex offers MCP tools as ``mcp__<server>``)
    namespace: str | None = None


@dataclass(frozen=True)
class HttpError:
    """An HTTP error answer: 429 with ``retry_after``, 401, 529, 500..."""

    status: int
    message: str = ""
    #: vendor error type; None: a sensible default for the status and protocol
    error_type: str | None = None
    retry_after: float | None = None
    headers: dict[str, str] = field(default_factory=dict)
    #: the whole JSON body, when a test needs an exact one (overrides message/error_type)
    body: Any = None


@dataclass
class Request:
    """One HTTP request the fake received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or the raw text when it is not JSON, or None
    #: the script step this request consumed (None: an auxiliary call answered by default)
    turn_index: int | None = None
    #: set by the protocol: this was a model call (it consumed a step or got the after-turn)
    model_call: bool = False
    status: int = 200

    def tool_names(self) -> list[str]:
        """Names of the tools the CLI offered the model in this request."""
        tools = self.body.get("tools") if isinstance(self.body, dict) else None
        names: list[str] = []
        for t in tools or []:
            if isinstance(t, dict):
                name = t.get("name") or (t.get("function") or {}).get("name")
                if isinstance(name, str):
                    names.append(name)
        return names


#: A turn, or a function of the request that returns one (to pick a tool name the CLI offers).
Turn = Text | ToolCall | HttpError | Callable[[Request], Text | ToolCall | HttpError]


class Script:
    """Turns served in order, one per model request; a turn may repeat (``times=None``: forever).

    When the script is exhausted, every further model request gets ``after`` (a short text turn
    by default), so a CLI that makes one call more than expected still ends.
    """

    def __init__(self, turns: Sequence[Turn | tuple[Turn, int | None]] = (), after: Turn | None = None):
        self._steps: list[tuple[Turn, int | None]] = []
        for t in turns:
            if isinstance(t, tuple):
                self._steps.append((t[0], t[1]))
            else:
                self._steps.append((t, 1))
        self.after: Turn = after if after is not None else Text("Done.")
        self._pos = 0
        self._used = 0
        self._lock = threading.Lock()
        self.served = 0

    def next(self, req: Request) -> tuple[Text | ToolCall | HttpError, int | None]:
        """The turn answering ``req`` and its step index (None once exhausted)."""
        with self._lock:
            index: int | None
            if self._pos < len(self._steps):
                turn, times = self._steps[self._pos]
                index = self._pos
                self._used += 1
                if times is not None and self._used >= times:
                    self._pos += 1
                    self._used = 0
            else:
                turn, index = self.after, None
            self.served += 1
        resolved = turn(req) if callable(turn) else turn
        return resolved, index

    @property
    def exhausted(self) -> bool:
        with self._lock:
            return self._pos >= len(self._steps)


class Recorder:
    """Every request a fake server received, in order; thread-safe, with condition waits."""

    def __init__(self) -> None:
        self._items: list[Request] = []
        self._cond = threading.Condition()

    def add(self, req: Request) -> None:
        with self._cond:
            self._items.append(req)
            self._cond.notify_all()

    @property
    def requests(self) -> list[Request]:
        with self._cond:
            return list(self._items)

    def model_requests(self) -> list[Request]:
        """The model calls (each consumed a script step or got the after-script turn), in order."""
        return [r for r in self.requests if r.model_call]

    def wait_for(self, pred: Callable[[list[Request]], bool], timeout: float = 30.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: pred(list(self._items)), timeout=timeout)

    def __iter__(self) -> Iterator[Request]:
        return iter(self.requests)

    def __len__(self) -> int:
        return len(self.requests)


def estimate_tokens(body: Any) -> int:
    """A rough, deterministic token count of a request body (4 characters a token)."""
    try:
        n = len(json.dumps(body))
    except (TypeError, ValueError):
        n = 0
    return max(1, n // 4)


Handler = Callable[["FakeHandler", Request], None]


class FakeHandler(BaseHTTPRequestHandler):
    """Parses the request, records it, and hands it to the server's protocol function."""

    server: FakeServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read the recorder
        return

    def _read_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.headers.get("Content-Encoding", "").lower() in ("gzip", "zstd", "br"):
            try:
                import gzip

                raw = gzip.decompress(raw)
            except OSError:
                pass
        if not raw:
            return None
        text = raw.decode("utf-8", "replace")
        try:
            return json.loads(text)
        except ValueError:
            return text

    def _handle(self) -> None:
        body = self._read_body() if self.command in ("POST", "PUT", "PATCH") else None
        req = Request(
            method=self.command,
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
        )
        try:
            self.server.protocol(self, req)
        finally:
            self.server.recorder.add(req)

    do_GET = _handle
    do_POST = _handle
    do_PUT = _handle
    do_DELETE = _handle
    do_PATCH = _handle

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    # -- answer helpers used by the protocol modules --------------------------------------

    def send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def start_sse(self, headers: dict[str, str] | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.close_connection = True

    def sse(self, event: str, data: Any) -> None:
        self.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()


class FakeServer(ThreadingHTTPServer):
    """A loopback HTTP server on a random port, serving one protocol function in threads."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, protocol: Handler, recorder: Recorder) -> None:
        super().__init__(("127.0.0.1", 0), FakeHandler)
        self.protocol = protocol
        self.recorder = recorder
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeServer:
        self._thread = threading.Thread(target=self.serve_forever, name="fakeapi", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


# -- running a coder's real program directly (no engine) ---------------------------------------


@dataclass
class AttemptRun:
    """What one direct run of a coder's program produced, normalized."""

    exit_code: int | None
    stdout: str
    stderr: str
    events: list[Any]  # list[fleet_tui.scheduler.model.Event]
    outcome: Any  # fleet_tui.scheduler.model.Outcome
    timed_out: bool = False

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]

    def of_kind(self, kind: str) -> list[Any]:
        return [e for e in self.events if e.kind == kind]


def run_attempt(coder: Any, ctx: Any, env: dict[str, str] | None = None, timeout: float = 90.0) -> AttemptRun:
    """Run ``coder``'s program for ``ctx`` the way the shim would, without the engine.

    ``prepare`` writes the per-run config, the process starts in ``ctx.workdir`` in its own session
    with ``os.environ`` + the task's env + ``coder.env(ctx)`` + ``env``, gets ``coder.stdin(ctx)``,
    and its stdout goes line by line through a fresh normalizer (``poll`` after each line and at
    the end). On ``timeout`` the whole process group is killed and the run is marked timed out.
    """
    import os
    import signal
    import subprocess

    coder.prepare(ctx)
    full_env = dict(os.environ)
    full_env.update(dict(ctx.task.spec.env))
    full_env.update(coder.env(ctx))
    full_env.update(env or {})
    full_env["PWD"] = str(ctx.workdir)
    data = coder.stdin(ctx)
    proc = subprocess.Popen(
        coder.argv(ctx),
        cwd=ctx.workdir,
        env=full_env,
        stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    timed_out = False
    try:
        out, err = proc.communicate(data, timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    norm = coder.normalizer(ctx.task.id, ctx.attempt, 0, ctx.attempt_dir)
    events: list[Any] = []
    text = out.decode("utf-8", "replace")
    for i, line in enumerate(text.splitlines()):
        events += norm.feed(line, float(i))
        events += norm.poll(float(i))
    code = None if timed_out else proc.returncode
    outcome = norm.outcome(code)
    events += norm.poll(float(len(events)))
    return AttemptRun(code, text, err.decode("utf-8", "replace"), events, outcome, timed_out)


def require_program(program: str) -> str:
    """A real agent CLI's path; skip (fail when CI=true) with the coder's install hint if missing."""
    import os
    import shutil

    import pytest

    from fleet_tui.coders.base import get_coder

    path = shutil.which(program)
    if path is None:
        msg = f"'{program}' not found on PATH; install it: {get_coder(program).install_hint}"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return path


#: A stand-in for fleet-tui's ask_human server, registered under the same name: it answers with
#: an environment variable, which proves the per-run config passed ``mcp_env`` through. Tests
#: write it to a file and register ``python FILE`` as the MCP command.
ECHO_MCP = """
import os
from mcp.server.mcpserver import MCPServer

server = MCPServer("ask_human")


@server.tool(name="ask_human", description="Ask the human supervising this run a question.")
def ask_human(question: str) -> str:
    return "answer: " + os.environ.get("FAKE_ANSWER", "<no env>") + " to " + question


server.run("stdio")
"""
