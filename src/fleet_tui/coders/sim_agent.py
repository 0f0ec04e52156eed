"""A simulated coding agent that speaks Claude Code's stream-json, for the demo and for tests.

Why it exists: fleet-tui must be usable (``fleet-tui demo``) and testable without an account
or a network, and every hard case the engine must survive (rate limits, false completions, a
stubborn process that ignores SIGTERM, a grandchild that escapes with ``setsid``, garbage
output, huge lines, a full context window, a question for a human) must be reproducible on
demand. This program behaves like ``claude -p --output-format stream-json --verbose``: the
same line shapes as the ``claude-*.jsonl`` fixtures, so the ``sim`` coder reuses the Claude
normalizer and exercises it for real. It is stdlib only and starts fast; ``mcp`` (and anyio)
are imported only when an ``ask`` directive actually calls the ``ask_human`` MCP server.

The directives (``@sim steps=3 pace=0.2`` ...) are parsed by sim_directives.py, which documents
every one of them; the README has the same table.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet_tui.coders.sim_directives import (  # noqa: F401 - re-exported for tests and tools
    ACTIONS,
    NO_CALL,
    PARAMS,
    SETTINGS,
    TERMINAL,
    Action,
    Plan,
    parse,
    parse_size,
)

FILE_ACTIONS = {"write", "append", "edit"}
ASK_TOOL = "mcp__ask_human__ask_human"
BASE_TOOLS = ["Task", "Bash", "Edit", "Glob", "Grep", "Read", "Write", "WebFetch", "TodoWrite"]
RETRY_DELAYS_MS = [1026, 1187, 2368, 4148, 9797, 18800, 38081, 39954, 33772, 34296]
RETRY_ERRORS = {429: "rate_limit", 529: "overloaded", 401: "authentication_failed"}
START_CONTEXT = 12_000
#: the tools ``steps`` cycles through: (tool, input, result content, tool_use_result, text)
STEP_TOOLS: list[tuple[str, dict[str, Any], str, Any, str]] = [
    (
        "Grep",
        {"pattern": "TODO", "output_mode": "files_with_matches"},
        "No files found",
        {"mode": "files_with_matches", "filenames": [], "numFiles": 0},
        "searching for TODOs",
    ),
    (
        "Glob",
        {"pattern": "**/*.py"},
        "No files found",
        {"filenames": [], "numFiles": 0, "truncated": False, "durationMs": 1},
        "listing Python files",
    ),
]

ToolRun = Callable[[], tuple[Any, bool, Any]]  # -> (content, is_error, tool_use_result)


def dumps(obj: Any) -> str:
    """Compact JSON, as Claude Code writes it."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _now_iso() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def _clock(epoch: float) -> str:
    t = time.localtime(epoch)
    return f"{t.tm_hour % 12 or 12}:{t.tm_min:02d}{'am' if t.tm_hour < 12 else 'pm'}"


def _bash(out: str) -> tuple[Any, bool, Any]:
    return (
        out,
        False,
        {"stdout": out, "stderr": "", "interrupted": False, "isImage": False, "noOutputExpected": not out},
    )


def _tool_error(msg: str) -> tuple[Any, bool, Any]:
    return f"<tool_use_error>{msg}</tool_use_error>", True, f"Error: {msg}"


class Sim:
    """Writes one simulated session to ``out`` and performs its file side effects in ``cwd``."""

    def __init__(self, plan: Plan, attempt: int, out: Any, cwd: Path, mcp_argv: list[str] | None) -> None:
        self.plan, self.attempt, self.out, self.cwd, self.mcp_argv = plan, attempt, out, cwd, mcp_argv
        self.session_id = str(uuid.uuid4())
        self.t0 = time.monotonic()
        self.calls, self.ctx = 0, 0
        self.total_calls = max(plan.planned_calls(), 1)
        self.totals = dict.fromkeys(
            ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens"), 0
        )
        self.done: list[str] = []  # what it did, for the final result text
        self.failing = 0 < attempt < plan.fail_until_attempt

    # -- output ---------------------------------------------------------------------------
    def write(self, data: bytes, newline: bool = True) -> None:
        self.out.write(data + b"\n" if newline else data)
        self.out.flush()

    def emit(self, obj: dict[str, Any], newline: bool = True) -> None:
        self.write(dumps(obj).encode("utf-8", "surrogateescape"), newline)

    def _base(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "uuid": str(uuid.uuid4())}

    def next_usage(self) -> dict[str, int]:
        """Usage of the next model call; its input+cache tokens are the context occupancy."""
        self.calls += 1
        prev = self.ctx
        if self.plan.context:
            frac = min((self.calls - 1) / max(self.total_calls - 1, 1), 1.0)
            target = int(START_CONTEXT + (self.plan.context - START_CONTEXT) * frac)
        else:
            target = START_CONTEXT + 450 * (self.calls - 1)
        self.ctx = max(target, prev + 3)
        usage = {
            "input_tokens": 3,
            "cache_creation_input_tokens": self.ctx - prev - 3,
            "cache_read_input_tokens": prev,
            "output_tokens": 40 + 7 * (self.calls % 9),
        }
        for k, v in usage.items():
            self.totals[k] += v
        return usage

    def message(
        self,
        block: dict[str, Any],
        usage: dict[str, int],
        msg_id: str | None = None,
        model: str | None = None,
    ) -> dict[str, Any]:
        """An assistant line (without timestamp/request_id) holding one content block."""
        return {
            "type": "assistant",
            "message": {
                "id": msg_id or f"msg_sim_{uuid.uuid4().hex[:24]}",
                "type": "message",
                "role": "assistant",
                "model": model or self.plan.model,
                "stop_reason": None,
                "stop_sequence": None,
                "content": [block],
                "usage": usage,
                "context_management": None,
            },
            "parent_tool_use_id": None,
            **self._base(),
        }

    def assistant(
        self,
        blocks: list[dict[str, Any]],
        extra: dict[str, Any] | None = None,
        usage: dict[str, int] | None = None,
        model: str | None = None,
        tool_extra: dict[str, Any] | None = None,
    ) -> None:
        """One model call: one line per content block, all with the same message id and usage."""
        msg_id = f"msg_sim_{uuid.uuid4().hex[:24]}"
        usage = usage if usage is not None else self.next_usage()
        request_id = f"req_sim_{uuid.uuid4().hex[:24]}"
        for block in blocks:
            line = self.message(block, usage, msg_id, model)
            line.update(timestamp=_now_iso(), request_id=request_id, **(extra or {}))
            if tool_extra and block["type"] == "tool_use":
                line.update(tool_extra)
            self.emit(line)

    def say(self, text: str) -> None:
        self.assistant([{"type": "text", "text": text}])

    def tool(
        self,
        name: str,
        tool_input: dict[str, Any],
        run: ToolRun,
        text: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """A tool call (assistant line(s)), the tool running, then its user tool_result line."""
        tool_id = f"toolu_sim_{uuid.uuid4().hex[:24]}"
        blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        blocks.append({"type": "tool_use", "id": tool_id, "name": name, "input": tool_input})
        self.assistant(blocks, tool_extra={"tool_use_meta": [{"id": tool_id, **meta}]} if meta else None)
        try:
            content, is_error, tool_result = run()
        except OSError as e:
            content, is_error, tool_result = _tool_error(str(e))
        self.emit(
            {
                "type": "user",
                "message": {
                    "role": "user",
                    "content": [
                        {
                            "tool_use_id": tool_id,
                            "type": "tool_result",
                            "content": content,
                            "is_error": is_error,
                        }
                    ],
                },
                "parent_tool_use_id": None,
                **self._base(),
                "timestamp": _now_iso(),
                "tool_use_result": tool_result,
            }
        )

    def result(
        self, text: str, is_error: bool = False, subtype: str = "success", extra: dict[str, Any] | None = None
    ) -> None:
        t = self.totals
        cost = self.plan.cost
        if cost is None:
            cost = round(
                (
                    t["input_tokens"] * 3
                    + t["cache_creation_input_tokens"] * 3.75
                    + t["cache_read_input_tokens"] * 0.3
                    + t["output_tokens"] * 15
                )
                / 1e6,
                6,
            )
        elapsed = int((time.monotonic() - self.t0) * 1000)
        model_usage = {
            self.plan.model: {
                "inputTokens": t["input_tokens"],
                "outputTokens": t["output_tokens"],
                "cacheReadInputTokens": t["cache_read_input_tokens"],
                "cacheCreationInputTokens": t["cache_creation_input_tokens"],
                "webSearchRequests": 0,
                "costUSD": cost,
                "contextWindow": self.plan.window,
                "maxOutputTokens": 32000,
            }
        }
        obj: dict[str, Any] = {
            "type": "result",
            "subtype": subtype,
            "is_error": is_error,
            "api_error_status": None,
            "duration_ms": elapsed,
            "duration_api_ms": elapsed // 2,
            "num_turns": max(self.calls, 1),
            "result": text,
            "stop_reason": "end_turn",
            "session_id": self.session_id,
            "total_cost_usd": cost,
            "usage": {
                **t,
                "server_tool_use": {"web_search_requests": 0, "web_fetch_requests": 0},
                "service_tier": "standard",
                "cache_creation": {
                    "ephemeral_1h_input_tokens": 0,
                    "ephemeral_5m_input_tokens": t["cache_creation_input_tokens"],
                },
            },
            "modelUsage": model_usage if self.calls else {},
            "permission_denials": [],
            "terminal_reason": "completed",
            "fast_mode_state": "off",
            "uuid": str(uuid.uuid4()),
        }
        obj.update(extra or {})
        self.emit(obj, newline=not self.plan.no_final_newline)

    def pause(self) -> None:
        if self.plan.pace > 0:
            time.sleep(self.plan.pace)

    def path(self, rel: str | None, inside: bool = True) -> Path:
        """``rel`` under the cwd; with ``inside``, refuse absolute paths and escapes."""
        if not rel:
            raise OSError("no path given")
        p = self.cwd / rel
        if inside and not p.resolve().is_relative_to(self.cwd.resolve()):
            raise OSError(f"path {rel!r} is outside the working directory")
        return p

    # -- the run --------------------------------------------------------------------------
    def run(self) -> int:
        servers = [{"name": "ask_human", "status": "connected", "source": "dynamic"}] if self.mcp_argv else []
        self.emit(
            {
                "type": "system",
                "subtype": "init",
                "cwd": str(self.cwd),
                "session_id": self.session_id,
                "tools": BASE_TOOLS + ([ASK_TOOL] if self.mcp_argv else []),
                "mcp_servers": servers,
                "model": self.plan.model,
                "permissionMode": "bypassPermissions",
                "slash_commands": ["compact", "context"],
                "apiKeySource": "none",
                "claude_code_version": "2.1.332",
                "output_style": "default",
                "agents": ["general-purpose"],
                "skills": [],
                "plugins": [],
                "uuid": str(uuid.uuid4()),
                "fast_mode_state": "off",
            }
        )
        try:
            for action in self.plan.actions:
                if self.failing and action.name in FILE_ACTIONS:
                    self.done.append(f"skipped {action.name} {action.value} on attempt {self.attempt}")
                    continue
                getattr(self, "do_" + action.name.replace("-", "_"))(action)
            if self.failing:
                self.finish_error(
                    f"Simulated failure on attempt {self.attempt} (this task succeeds from "
                    f"attempt {self.plan.fail_until_attempt}) after: {self.summary()}.",
                    1,
                )
            self.finish_success()
        except SystemExit as e:  # an action ended the run with this exit code
            return int(e.code or 0)
        return 0

    def summary(self) -> str:
        return "; ".join(self.done) if self.done else "nothing to change"

    def finish_success(self) -> None:
        text = f"Simulated run (attempt {self.attempt}) finished: {self.summary()}."
        self.say(text)
        self.result(text)
        raise SystemExit(0)

    def finish_error(self, message: str, code: int) -> None:
        self.say(message)
        self.result(
            message,
            is_error=True,
            subtype="error_during_execution",
            extra={"terminal_reason": "aborted_tools", "errors": [message]},
        )
        raise SystemExit(code)

    # -- actions (one method per directive) -----------------------------------------------
    def do_steps(self, a: Action) -> None:
        n = int(a.num(None, 0))
        for i in range(1, n + 1):
            if i % 3 == 1:
                listing = "\n".join(sorted(os.listdir(self.cwd))[:20])
                self.tool(
                    "Bash",
                    {"command": "ls", "description": f"Look around (step {i}/{n})"},
                    lambda s=listing: _bash(s),  # type: ignore[misc]
                    text=f"Step {i}/{n}: looking at the working tree.",
                )
            else:
                name, inp, content, res, what = STEP_TOOLS[i % 3 - 2]
                self.tool(
                    name,
                    inp,
                    lambda c=content, r=res: (c, False, r),  # type: ignore[misc]
                    text=f"Step {i}/{n}: {what}.",
                )
            self.pause()
        self.done.append(f"took {n} steps")

    def do_say(self, a: Action) -> None:
        self.say(a.value or "Thinking about the task.")
        self.pause()

    def do_write(self, a: Action) -> None:
        text = a.param("text", "Written by the fleet-tui sim agent.\n")

        def run() -> tuple[Any, bool, Any]:
            p = self.path(a.value)
            existed = p.exists()
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text, encoding="utf-8")
            self.done.append(f"wrote {a.value}")
            return (
                f"File {'updated' if existed else 'created'} successfully at: {p}",
                False,
                {"type": "update" if existed else "create", "filePath": str(p), "content": text},
            )

        self.tool("Write", {"file_path": str(self.cwd / (a.value or "")), "content": text}, run)
        self.pause()

    def do_append(self, a: Action) -> None:
        text = a.param("text", "Appended by the fleet-tui sim agent.\n")

        def run() -> tuple[Any, bool, Any]:
            p = self.path(a.value)
            p.parent.mkdir(parents=True, exist_ok=True)
            with p.open("a", encoding="utf-8") as f:
                f.write(text)
            self.done.append(f"appended to {a.value}")
            return _bash("")

        cmd = f"printf %s {shlex.quote(text)} >> {shlex.quote(a.value or '')}"
        self.tool("Bash", {"command": cmd, "description": f"Append to {a.value}"}, run)
        self.pause()

    def do_edit(self, a: Action) -> None:
        old, new, replace_all = a.param("old"), a.param("new"), "all" in a.params

        def run() -> tuple[Any, bool, Any]:
            p = self.path(a.value)
            if not p.exists():
                return _tool_error("File does not exist.")
            body = p.read_text(encoding="utf-8")
            if not old or old not in body:
                return _tool_error(f"String to replace not found in file.\nString: {old}")
            count = body.count(old) if replace_all else 1
            p.write_text(body.replace(old, new, -1 if replace_all else 1), encoding="utf-8")
            self.done.append(f"edited {a.value} ({count} replacement{'s' if count != 1 else ''})")
            return (
                f"The file {p} has been updated successfully.",
                False,
                {
                    "filePath": str(p),
                    "oldString": old,
                    "newString": new,
                    "replaceAll": replace_all,
                    "userModified": False,
                },
            )

        self.tool(
            "Edit",
            {
                "file_path": str(self.cwd / (a.value or "")),
                "old_string": old,
                "new_string": new,
                "replace_all": replace_all,
            },
            run,
        )
        self.pause()

    def do_ask(self, a: Action) -> None:
        question = a.value or "How should I proceed?"
        options = [o.strip() for o in a.param("options").split(",") if o.strip()]
        tool_input: dict[str, Any] = {"question": question, **({"options": options} if options else {})}

        def run() -> tuple[Any, bool, Any]:
            if not self.mcp_argv:
                self.done.append(f"could not ask {question!r}")
                return _tool_error(f"No such tool available: {ASK_TOOL} (FLEET_MCP_COMMAND is not set)")
            try:
                answer, is_error = mcp_ask(self.mcp_argv, tool_input)
            except Exception as e:  # the server may be missing or crash: the agent goes on
                answer, is_error = f"ask_human failed: {type(e).__name__}: {e}", True
            self.done.append(f"asked {question!r} -> {answer!r}")
            blocks = [{"type": "text", "text": answer}]
            return blocks, is_error, blocks

        meta = {"display_name": "Ask human", "server_display_name": "ask_human", "tool_name": "ask_human"}
        self.tool(ASK_TOOL, tool_input, run, text="I need a decision from a human.", meta=meta)
        self.pause()

    def do_sleep(self, a: Action) -> None:
        s = a.num(None, 1.0)

        def run() -> tuple[Any, bool, Any]:
            time.sleep(s)
            return _bash("")

        self.tool("Bash", {"command": f"sleep {s:g}", "description": "Wait"}, run)
        self.done.append(f"slept {s:g}s")

    def do_repeat(self, a: Action) -> None:
        n, cmd = int(a.num(None, 5)), a.param("command", "npm test")
        for _ in range(n):  # the very same call, the very same failure: a stuck agent
            self.tool(
                "Bash",
                {"command": cmd, "description": "Run the tests"},
                lambda: ("1 failing\nError: expected 200, got 500", True, None),
                text="The test still fails; let me run it again.",
            )
            self.pause()
        self.done.append(f"ran {cmd!r} {n} times")

    def do_wait_file(self, a: Action) -> None:
        timeout = a.num("timeout", 300.0)

        def run() -> tuple[Any, bool, Any]:
            p = self.path(a.value, inside=False)
            deadline = time.monotonic() + timeout
            while not p.exists():
                if time.monotonic() > deadline:
                    return _tool_error(f"timed out after {timeout:g}s waiting for {a.value}")
                time.sleep(0.02)
            self.done.append(f"waited for {a.value}")
            return _bash(f"{a.value} exists")

        cmd = f"while [ ! -e {shlex.quote(a.value or '')} ]; do sleep 0.02; done"
        self.tool("Bash", {"command": cmd, "description": f"Wait for {a.value}"}, run)

    def do_escape(self, a: Action) -> None:
        seconds = a.num("seconds", 300.0)

        def run() -> tuple[Any, bool, Any]:
            import subprocess

            child = subprocess.Popen(  # start_new_session: the child calls setsid() before exec
                [sys.executable, "-c", "import sys, time; time.sleep(float(sys.argv[1]))", f"{seconds:g}"],
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
            child.returncode = 0  # never waited for on purpose: keep Popen.__del__ quiet
            if a.value:
                pidfile = self.path(a.value, inside=False)
                tmp = pidfile.with_name(pidfile.name + ".tmp")
                tmp.write_text(f"{child.pid}\n")
                os.replace(tmp, pidfile)
            self.done.append(f"left a detached process {child.pid} running")
            return _bash(str(child.pid))

        target = shlex.quote(a.value or "/dev/null")
        cmd = f"setsid nohup sleep {seconds:g} >/dev/null 2>&1 & echo $! > {target}"
        self.tool("Bash", {"command": cmd, "description": "Start a background helper"}, run)
        self.pause()

    def retries(self, n: int, status: int = 429) -> None:
        for i in range(1, n + 1):
            self.emit(
                {
                    "type": "system",
                    "subtype": "api_retry",
                    "attempt": i,
                    "max_retries": max(n, 10),
                    "retry_delay_ms": RETRY_DELAYS_MS[min(i, len(RETRY_DELAYS_MS)) - 1],
                    "error_status": status,
                    "error": RETRY_ERRORS.get(status, "server_error"),
                    **self._base(),
                }
            )
            self.pause()

    def do_api_retry(self, a: Action) -> None:
        n, status = int(a.num(None, 1)), int(a.num("status", 429))
        self.retries(n, status)
        self.done.append(f"got through {n} API retries ({status})")

    def rate_event(self, status: str, resets_at: int, utilization: float | None = None) -> None:
        info: dict[str, Any] = {"status": status, "resetsAt": resets_at, "rateLimitType": "five_hour"}
        if utilization is not None:
            info["utilization"] = utilization
        if status == "rejected":
            info.update(overageStatus="rejected", overageDisabledReason="out_of_credits")
        info["isUsingOverage"] = False
        self.emit({"type": "rate_limit_event", "rate_limit_info": info, **self._base()})

    def do_rate_warning(self, a: Action) -> None:
        self.rate_event("allowed_warning", int(time.time() + a.num("seconds", 3600.0)), a.num(None, 0.85))

    def do_rate_limit(self, a: Action) -> None:
        self.retries(int(a.num("retries", 0)))
        resets_at = int(time.time() + a.num(None, 60.0))
        self.rate_event("rejected", resets_at)
        text = f"You've hit your session limit · resets {_clock(resets_at)}"
        zero = dict.fromkeys(
            ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"), 0
        )
        err = {"api_error_status": 429, "api_error_type": "rate_limit_error"}
        self.assistant(
            [{"type": "text", "text": text}],
            usage=zero,
            model="<synthetic>",
            extra={"error": "rate_limit", "is_api_error_message": True, **err},
        )
        self.result(
            text, is_error=True, extra={**err, "terminal_reason": "api_error", "stop_reason": "stop_sequence"}
        )
        raise SystemExit(1)

    def do_fail(self, a: Action) -> None:
        self.finish_error(a.value or f"Simulated failure after: {self.summary()}.", 1)

    def do_exit(self, a: Action) -> None:
        code = int(a.num(None, 0))
        if code == 0:
            self.finish_success()
        self.finish_error(f"Simulated exit with code {code} after: {self.summary()}.", code)

    def do_crash(self, a: Action) -> None:
        raise SystemExit(int(a.num(None, 1)))

    def do_false_completion(self, a: Action) -> None:
        text = "I implemented the requested change and all tests pass."
        self.say(text)
        self.result(text)
        raise SystemExit(0)

    def do_garbage(self, a: Action) -> None:
        samples = [
            b"sim: plain progress output, not JSON",
            b'{"type":"assistant","message":{"trunc',
            b"\x1b[31mANSI coloured text\x1b[0m",
            b"{}",
            b"null",
            b'"a bare JSON string"',
            b"[1, 2, 3]",
            b'{"type":"mystery_event","payload":42}',
            b"   ",
        ]
        for i in range(int(a.num(None, 3))):
            self.write(samples[i % len(samples)])

    def do_invalid_utf8(self, a: Action) -> None:
        self.write(b"sim: invalid utf-8 follows: \xff\xfe\xc3\x28 end")
        line = dumps(self.message({"type": "text", "text": "BAD"}, self.next_usage())).encode()
        self.write(line.replace(b'"BAD"', b'"bad bytes: \xc3\x28\xff"'))

    def do_huge(self, a: Action) -> None:
        n = parse_size(a.value or "1M")
        line = dumps(self.message({"type": "text", "text": "PAD"}, self.next_usage())).encode()
        self.write(line.replace(b"PAD", b"x" * max(n - (len(line) - 3), 0), 1))
        self.done.append(f"printed a {n}-byte line")

    def do_burst(self, a: Action) -> None:
        rate, seconds = max(a.num(None, 100.0), 1.0), a.num("seconds", 1.0)
        n = int(rate * seconds)
        usage = {
            "input_tokens": 3,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": self.ctx,
            "output_tokens": 8,
        }
        line = self.message({"type": "text", "text": "burst event @@"}, usage, msg_id="msg_sim_burst_@@")
        line["uuid"] = "00000000-0000-4000-8000-@@"
        head, mid, mid2, tail = dumps(line).encode().split(b"@@")
        tag = uuid.uuid4().hex[:8].encode() + b"_"
        t0, batch = time.monotonic(), bytearray()
        for i in range(n):
            wait = t0 + i / rate - time.monotonic()
            if wait > 0 or len(batch) > 65536:
                self.write(bytes(batch), newline=False)
                batch.clear()
                if wait > 0:
                    time.sleep(wait)
            k = b"%d" % i
            batch += head + tag + k + mid + k + mid2 + b"%012d" % i + tail + b"\n"
        self.write(bytes(batch), newline=False)
        self.calls += n
        for key, v in usage.items():
            self.totals[key] += v * n
        self.done.append(f"emitted {n} events at {rate:g}/s")

    def do_stderr(self, a: Action) -> None:
        sys.stderr.write((a.value or "sim: a line on stderr") + "\n")
        sys.stderr.flush()


def mcp_ask(argv: list[str], arguments: dict[str, Any]) -> tuple[str, bool]:
    """Call ``ask_human`` on the stdio MCP server ``argv``: (answer text, is_error)."""
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client

    async def call() -> tuple[str, bool]:
        params = StdioServerParameters(command=argv[0], args=list(argv[1:]), env=dict(os.environ))
        async with stdio_client(params, errlog=sys.stderr) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            res = await s.call_tool("ask_human", arguments)
        texts = [getattr(c, "text", "") for c in res.content if getattr(c, "type", "") == "text"]
        return "\n".join(texts), bool(res.is_error)

    return anyio.run(call)


def read_prompt(args: list[str]) -> str:
    """The arguments, else $FLEET_PROMPT, else stdin (never a terminal)."""
    if args:
        return " ".join(args)
    if "FLEET_PROMPT" in os.environ:
        return os.environ["FLEET_PROMPT"]
    try:
        if sys.stdin is None or sys.stdin.isatty():
            return ""
        return sys.stdin.buffer.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return ""


def mcp_argv_from_env() -> list[str] | None:
    raw = os.environ.get("FLEET_MCP_COMMAND")
    if not raw:
        return None
    try:
        argv = json.loads(raw)
    except ValueError:
        argv = None
    if isinstance(argv, list) and argv and all(isinstance(x, str) for x in argv):
        return argv
    sys.stderr.write("sim: FLEET_MCP_COMMAND ignored: not a JSON list of strings\n")
    return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in {"-h", "--help"}:
        print(__doc__)
        return 0
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # a closed stdout ends us like a real CLI
    try:
        attempt_no: int | None = int(os.environ.get("FLEET_ATTEMPT", ""))
    except ValueError:
        attempt_no = None
    plan = parse(read_prompt(args), os.environ.get("FLEET_SIM_MODEL"), attempt_no)
    if plan.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for w in plan.warnings:
        sys.stderr.write(f"sim: {w}\n")
    try:
        attempt = int(os.environ.get("FLEET_ATTEMPT") or 1)
    except ValueError:
        attempt = 1
    return Sim(plan, attempt, sys.stdout.buffer, Path.cwd(), mcp_argv_from_env()).run()


if __name__ == "__main__":
    sys.exit(main())
