"""The OpenCode coder: ``opencode run --format json`` in, normalized Events out.

Why this module exists: OpenCode's headless output has its own shape (FORMATS.md section 3):
no init event, no final result event, tool calls reported only once finished, usage and cost per
LLM step (``step_finish``), and errors as ``{"type":"error","error":{"name","data":{...}}}``.
This module is the only place that knows that, plus how to give each run its own configuration
on top of the user's own: an ``OPENCODE_CONFIG`` file (permissions for unattended runs, the
``ask_human`` MCP server) that OpenCode merges over the user's config, and per-run data, state
and cache directories under the attempt directory.

Two behaviours the engine must cover, because nothing on stdout reveals them:

* OpenCode retries retryable errors (429, 5xx) silently, printing nothing meanwhile. Builds
  around 1.18.10 retry without an upper bound (anomalyco/opencode#21960): only the engine's
  inactivity timeout ends such a run, and the engine classifies it (``stalled``), not this
  module. 1.18.33, as run by tests/coders/test_real_opencode.py, gives up after 5 retries
  (about 80 s of exponential back-off; about 10 s when the API sends ``retry-after: 1``), so an
  inactivity timeout shorter than that turns a recoverable 429 into a stall.
* OpenCode puts no rate-limit data on stdout while it retries (cost arrives per finished
  step only). A 429 becomes visible only when OpenCode gives up and prints an ``error`` line with
  ``statusCode: 429`` (and the response headers); that yields a ``rate_limit`` event and the
  ``rate_limited`` outcome.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from fleet_tui.coders.base import (
    AttemptContext,
    BaseCoder,
    BaseNormalizer,
    CannotResume,
    Setup,
    link_user_files,
    read_text,
    write_private,
)
from fleet_tui.scheduler.model import Event, Outcome, RateLimit, Usage

__all__ = ["OpenCodeCoder", "OpenCodeNormalizer"]

#: Step-finish reasons that mean "the model wants the tool results": the run goes on.
_CONTINUE_REASONS = frozenset({"tool-calls", "tool_calls", "tool-use"})
#: Step-finish reasons that end a turn without a proper answer.
_BAD_FINISH_REASONS = frozenset({"error", "content-filter", "length"})
#: ``error.name`` values that mean the credentials are missing or rejected.
_AUTH_ERROR_NAMES = frozenset({"ProviderAuthError", "AuthError", "UnauthorizedError"})


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _as_int(v: Any) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def _iso_to_epoch(v: str) -> float | None:
    try:
        return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _resets_at(data: dict[str, Any], ts: float) -> float | None:
    """When a 429 lifts, from the provider's response headers (retry-after, *-reset)."""
    headers = data.get("responseHeaders")
    if not isinstance(headers, dict):
        return None
    h = {str(k).lower(): v for k, v in headers.items()}
    for key, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        v = h.get(key)
        if isinstance(v, (str, int, float)):
            try:
                return ts + float(v) * scale
            except ValueError:
                pass
    resets = [
        r for k, v in h.items() if k.endswith("-reset") and isinstance(v, str) for r in [_iso_to_epoch(v)]
    ]
    found = [r for r in resets if r is not None]
    return max(found) if found else None


class OpenCodeNormalizer(BaseNormalizer):
    """Maps ``opencode run --format json`` lines to Events; one instance per attempt.

    * the first line carrying ``sessionID`` -> ``session_started`` (OpenCode has no init event);
    * ``text`` -> ``text``; ``reasoning`` (only with ``--thinking``) -> ``thinking``;
    * ``tool_use`` (emitted once the call is finished) -> ``tool_call`` then ``tool_result``
      paired by ``part.callID``;
    * ``step_finish`` -> ``usage`` for that step: token *deltas* (summing every usage event
      gives the run's total, as with the other coders), the step's own ``cost`` in USD, and
      ``context_tokens`` = input + cache read + cache write of that step (the context occupancy).
      A ``step_finish`` whose reason is not ``tool-calls`` ends the model's turn: a ``result``
      event follows with the turn's text and the run's *total* cost (no usage, so nothing is
      counted twice); ``self.totals`` keeps the summed tokens;
    * ``error`` -> ``error`` (plus ``rate_limit`` when ``statusCode`` is 429);
    * ``done`` (one upstream version only) -> ``result`` if none was emitted yet.
    """

    def __init__(
        self, task_id: str, attempt: int, start_seq: int = 0, attempt_dir: Path | None = None
    ) -> None:
        super().__init__(task_id, attempt, start_seq)
        self.attempt_dir = attempt_dir
        self.session_id: str | None = None
        self.totals = Usage()
        self.errors: list[dict[str, Any]] = []
        self.error_after_result = False
        self.result_seen = False
        self.lines = 0
        self.turn_text: list[str] = []

    # -- feeding -------------------------------------------------------------------------

    def feed(self, line: str, ts: float) -> list[Event]:
        obj = self.parse_json(line)
        if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
            return self.fallback(line, ts)
        self.lines += 1
        try:
            return self._feed(obj, ts)
        except Exception:  # a field of an unexpected type: keep the line, never raise
            return [self.ev(ts, "text", text=line.strip(), raw=obj)]

    def _feed(self, obj: dict[str, Any], ts: float) -> list[Event]:
        out: list[Event] = []
        sid = obj.get("sessionID")
        if isinstance(sid, str) and sid and self.session_id is None:
            self.session_id = sid
            out.append(self.ev(ts, "session_started", session_id=sid, raw={"sessionID": sid}))
        kind = obj["type"]
        part = _dict(obj.get("part"))
        if kind == "step_start":
            self.turn_text = []
        elif kind == "text":
            text = part.get("text")
            if isinstance(text, str) and text:
                self.turn_text.append(text)
                out.append(self.ev(ts, "text", text=text, session_id=self.session_id, raw=obj))
        elif kind == "reasoning":
            text = part.get("text")
            if isinstance(text, str) and text:
                out.append(self.ev(ts, "thinking", text=text, session_id=self.session_id, raw=obj))
        elif kind == "tool_use":
            out.extend(self._tool(part, obj, ts))
        elif kind == "step_finish":
            out.extend(self._step_finish(part, obj, ts))
        elif kind == "error":
            out.extend(self._error(obj, ts))
        elif kind == "done":
            if not self.result_seen:
                out.append(self._result(ts, obj, is_error=bool(self.errors)))
        else:  # an event type this version does not know: keep it visible, unparsed
            out.append(self.ev(ts, "lifecycle", text=f"opencode: {kind}", raw=obj))
        return out

    def _tool(self, part: dict[str, Any], obj: dict[str, Any], ts: float) -> list[Event]:
        call_id = part.get("callID") or part.get("id")
        tool_id = str(call_id) if call_id is not None else None
        name = str(part.get("tool") or "tool")
        state = _dict(part.get("state"))
        status = state.get("status")
        call = self.ev(
            ts, "tool_call", tool=name, tool_input=state.get("input"), tool_id=tool_id,
            session_id=self.session_id, raw=obj,
        )  # fmt: skip
        if status not in ("completed", "error"):  # pending/running: a future version may send it
            return [call]
        is_error = status == "error"
        body = state.get("error") if is_error else state.get("output")
        text = body if isinstance(body, str) else (json.dumps(body) if body is not None else "")
        result = self.ev(
            ts, "tool_result", tool=name, tool_id=tool_id, text=text, is_error=is_error,
            session_id=self.session_id, raw=None,
        )  # fmt: skip
        return [call, result]

    def _step_finish(self, part: dict[str, Any], obj: dict[str, Any], ts: float) -> list[Event]:
        tokens = _dict(part.get("tokens"))
        cache = _dict(tokens.get("cache"))
        usage = Usage(
            input_tokens=_as_int(tokens.get("input")),
            output_tokens=_as_int(tokens.get("output")) + _as_int(tokens.get("reasoning")),
            cache_read_tokens=_as_int(cache.get("read")),
            cache_creation_tokens=_as_int(cache.get("write")),
        )
        self.totals = Usage(
            self.totals.input_tokens + usage.input_tokens,
            self.totals.output_tokens + usage.output_tokens,
            self.totals.cache_read_tokens + usage.cache_read_tokens,
            self.totals.cache_creation_tokens + usage.cache_creation_tokens,
        )
        cost = part.get("cost")
        step_cost = float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None
        if step_cost is not None:
            self.cost_usd = (self.cost_usd or 0.0) + step_cost
        context = usage.input_tokens + usage.cache_read_tokens + usage.cache_creation_tokens
        out = [
            self.ev(
                ts, "usage", usage=usage, cost_usd=step_cost, context_tokens=context or None,
                session_id=self.session_id, raw=obj,
            )
        ]  # fmt: skip
        reason = part.get("reason")
        if reason not in _CONTINUE_REASONS:
            out.append(self._result(ts, obj, is_error=reason in _BAD_FINISH_REASONS, reason=reason))
        return out

    def _result(self, ts: float, obj: dict[str, Any], is_error: bool, reason: Any = None) -> Event:
        text = "".join(self.turn_text) or self.last_text or ""
        if reason in _BAD_FINISH_REASONS and not text:
            text = f"model stopped: {reason}"
        self.result_seen = True
        self.error_after_result = False
        self.result_text = text
        self.result_is_error = is_error
        return self.ev(
            ts, "result", text=text, is_error=is_error, cost_usd=self.cost_usd,
            session_id=self.session_id, raw=obj,
        )  # fmt: skip

    def _error(self, obj: dict[str, Any], ts: float) -> list[Event]:
        err = _dict(obj.get("error"))
        data = _dict(err.get("data"))
        name = str(err.get("name") or "error")
        message = data.get("message") if isinstance(data.get("message"), str) else None
        self.errors.append({"name": name, "data": data})
        if self.result_seen:
            self.error_after_result = True
        text = f"{name}: {message}" if message else name
        out = [self.ev(ts, "error", text=text, is_error=True, session_id=self.session_id, raw=obj)]
        if data.get("statusCode") == 429:
            rl = RateLimit(
                account="opencode", status="rejected", resets_at=_resets_at(data, ts), observed_at=ts
            )
            self.rate_limit = rl
            out.append(self.ev(ts, "rate_limit", rate_limit=rl, text=message, session_id=self.session_id))
        return out

    # -- the end ---------------------------------------------------------------------------

    def outcome(self, exit_code: int | None) -> Outcome:
        """Classified from structure: the last ``error`` line's ``statusCode`` / ``name``, whether
        a turn finished after it, and the exit code (OpenCode exits 1 after any session error).
        """
        common: dict[str, Any] = {"result_text": self.result_text, "cost_usd": self.cost_usd}
        failed_after = bool(self.errors) and (not self.result_seen or self.error_after_result)
        if failed_after or (self.errors and exit_code not in (0, None)):
            last = self.errors[-1]
            data = last["data"]
            status = data.get("statusCode")
            msg = data.get("message") if isinstance(data.get("message"), str) else last["name"]
            detail = f"{last['name']}" + (f" {status}" if status is not None else "") + f": {msg}"
            if status == 429:
                resets = self.rate_limit.resets_at if self.rate_limit else None
                return Outcome("rate_limited", detail, resets_at=resets, **common)
            if status in (401, 403) or last["name"] in _AUTH_ERROR_NAMES:
                return Outcome("auth_failed", detail, **common)
            return Outcome("failure", detail, **common)
        if exit_code is None:
            return Outcome("failure", "opencode did not report an exit status", **common)
        if exit_code != 0:
            return Outcome("failure", f"opencode exited {exit_code}", **common)
        if not self.result_seen:
            what = "no output" if self.lines == 0 else "no finished turn"
            return Outcome("failure", f"opencode exited 0 with {what}", **common)
        if self.result_is_error:
            return Outcome("failure", self.result_text or "the model's turn ended badly", **common)
        return Outcome("success", "", claimed_success=True, **common)


class OpenCodeCoder(BaseCoder):
    """``opencode run --format json`` with the prompt on stdin and a per-run config layered on top.

    OpenCode loads the user's config itself (``~/.config/opencode/opencode.json``, the project's
    ``opencode.json``, agents, commands, plugins, providers, default model, MCP servers) and
    merges the file named by ``OPENCODE_CONFIG`` over it: that per-run file (0600) only adds
    what an unattended run needs, the permissions and fleet's ``ask_human`` server (with
    ``mcp = "fleet-only"`` it also disables each of the user's servers). Data, state and cache go
    to per-run ``XDG_*`` directories so sessions never land in the user's home; the user's
    ``opencode auth login`` credentials are linked in.

    No ``--auto`` flag: the per-run config's ``permission`` block allows edits and shell, which
    works on versions before and after ``--auto`` existed. The engine's inactivity timeout is
    what ends a run that OpenCode keeps retrying: 429s are retried silently (forever on some
    1.18 builds), and stdout carries no cost or rate-limit data until it gives up.
    """

    name: ClassVar[str] = "opencode"
    program: ClassVar[str | None] = "opencode"
    install_hint: ClassVar[str] = "npm install -g opencode-ai"
    #: where the user's login lives (symlinked into the run; a refreshed token is written back)
    sandbox_state: ClassVar[tuple[str, ...]] = ("~/.local/share/opencode/",)

    @staticmethod
    def config_path(ctx: AttemptContext) -> Path:
        return ctx.attempt_dir / "opencode" / "opencode.json"

    @staticmethod
    def xdg_dirs(ctx: AttemptContext) -> dict[str, Path]:
        base = ctx.attempt_dir / "opencode" / "xdg"
        return {
            "XDG_DATA_HOME": base / "data",
            "XDG_STATE_HOME": base / "state",
            "XDG_CACHE_HOME": base / "cache",
        }

    def argv(self, ctx: AttemptContext) -> list[str]:
        # the prompt comes on stdin (opencode run appends piped stdin to the message): no ARG_MAX
        # limit, and it never shows in ps
        cmd = ["opencode", "run", "--format", "json"]
        if ctx.model:
            cmd += ["--model", ctx.model]
        cmd += ["--dir", str(ctx.workdir)]
        return cmd

    def stdin(self, ctx: AttemptContext) -> bytes | None:
        return ctx.prompt.encode("utf-8")

    can_resume: ClassVar[bool] = True

    def resume_argv(self, ctx: AttemptContext, session_id: str, previous: Path) -> list[str]:
        """``opencode run --session <id>``: the session lives in the run's own data dir
        (``opencode.db``), copied from the previous run's."""
        old = previous / "opencode" / "xdg" / "data" / "opencode"
        if not (old / "opencode.db").is_file():
            raise CannotResume(f"opencode session {session_id} not found (its database is gone)")
        new = self.xdg_dirs(ctx)["XDG_DATA_HOME"] / "opencode"
        new.mkdir(parents=True, exist_ok=True)
        for f in old.glob("opencode.db*"):
            shutil.copy2(f, new / f.name)
        cmd = self.argv(ctx)
        at = cmd.index("--dir")
        return [*cmd[:at], "--session", session_id, *cmd[at:]]

    def env(self, ctx: AttemptContext) -> dict[str, str]:
        env = {k: str(v) for k, v in self.xdg_dirs(ctx).items()}
        env.update(
            {
                "OPENCODE_CONFIG": str(self.config_path(ctx)),
                "OPENCODE_DISABLE_AUTOUPDATE": "1",
                "OPENCODE_DISABLE_SHARE": "1",
                # OpenCode resolves its working directory from $PWD, not the process cwd
                "PWD": str(ctx.workdir),
            }
        )
        return env

    @staticmethod
    def user_config_files(workdir: Path | None = None) -> list[Path]:
        """The user's OpenCode config files that exist: global, ``$OPENCODE_CONFIG``, project."""
        xdg = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        names = ("config.json", "opencode.json", "opencode.jsonc")
        found = [Path(xdg) / "opencode" / n for n in names]
        if os.environ.get("OPENCODE_CONFIG"):
            found.append(Path(os.environ["OPENCODE_CONFIG"]))
        if workdir is not None:
            for d in [workdir, *workdir.parents]:
                found += [d / n for n in ("opencode.json", "opencode.jsonc")]
                if (d / ".git").exists():
                    break
        return [p for p in found if p.is_file()]

    @staticmethod
    def _load(path: Path) -> dict[str, Any]:
        text = read_text(path)
        if text is None:
            return {}
        try:
            data = json.loads(text)
        except ValueError:  # JSONC: drop whole-line comments, then try again
            lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("//")]
            try:
                data = json.loads("\n".join(lines))
            except ValueError:
                return {}
        return data if isinstance(data, dict) else {}

    def user_servers(self, workdir: Path | None = None) -> list[str]:
        names: set[str] = set()
        for p in self.user_config_files(workdir):
            names.update(str(k) for k in _dict(self._load(p).get("mcp")))
        names.discard("ask_human")
        return sorted(names)

    def runtime_config(self, ctx: AttemptContext) -> dict[str, Any]:
        """The per-run OpenCode config (written to ``OPENCODE_CONFIG`` by ``prepare``)."""
        cfg: dict[str, Any] = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            # unattended: no one is there to approve; "ask" would be auto-rejected headless
            "permission": {
                "edit": "allow",
                "bash": "allow",
                "webfetch": "allow",
                "external_directory": "allow",
                "doom_loop": "allow",
            },
        }
        mcp: dict[str, Any] = {}
        if not ctx.user_mcp:
            mcp.update({name: {"enabled": False} for name in self.user_servers(ctx.workdir)})
        if ctx.mcp_command:
            mcp["ask_human"] = {
                "type": "local",
                "command": list(ctx.mcp_command),
                "environment": dict(ctx.mcp_env),
                "enabled": True,
                "timeout": 30000,  # time allowed to list the tools, not a call timeout
            }
        if mcp:
            cfg["mcp"] = mcp
        return cfg

    def prepare(self, ctx: AttemptContext) -> None:
        path = self.config_path(ctx)
        for d in self.xdg_dirs(ctx).values():
            d.mkdir(parents=True, exist_ok=True)
        write_private(path, json.dumps(self.runtime_config(ctx), indent=2) + "\n")
        self._link_credentials(ctx)

    def _link_credentials(self, ctx: AttemptContext) -> None:
        """Let the run see the user's ``opencode auth login`` credentials (read-only intent).

        The per-run ``XDG_DATA_HOME`` hides ``~/.local/share/opencode/auth.json``; a symlink keeps
        logins working without copying secrets into the attempt directory.
        """
        user_data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        link_user_files(
            Path(user_data) / "opencode", self.xdg_dirs(ctx)["XDG_DATA_HOME"] / "opencode", ("auth.json",)
        )

    def setup(self, user_mcp: bool = True) -> Setup:
        files = self.user_config_files(Path.cwd())
        model: str | None = None
        for p in files:
            m = self._load(p).get("model")
            if isinstance(m, str) and m:
                model = m  # later files win, as in OpenCode's own merge
        servers = self.user_servers(Path.cwd()) if user_mcp else []
        notes = () if user_mcp else ("mcp = fleet-only: the user's MCP servers are disabled",)
        return Setup(tuple(map(str, files)), (*servers, "ask_human"), model or "OpenCode's default", notes)

    def normalizer(
        self, task_id: str, attempt: int, start_seq: int = 0, attempt_dir: Path | None = None
    ) -> OpenCodeNormalizer:
        return OpenCodeNormalizer(task_id, attempt, start_seq, attempt_dir)
