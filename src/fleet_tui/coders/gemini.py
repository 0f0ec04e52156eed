"""The Gemini CLI coder: ``gemini -p … --output-format stream-json`` in, normalized Events out.

Why this module exists: Gemini CLI's headless stream (FORMATS.md section 4) has its own event
set (``init``, ``message`` deltas, ``tool_use``/``tool_result``, ``error``, ``result`` with
session ``stats``), reports fatal errors as a ``result`` whose ``error.type`` is the error class
name, and signals some failures only through the exit code (``FatalError`` codes: 41 auth, 42
input, 44 sandbox, 52 config, 53 turn limit, 54 tool execution, 55 untrusted workspace, 130
cancelled; a terminal 429 exits with its HTTP status, which POSIX truncates to 173). Its auth
failure in stream-json prints nothing on stdout and exits 41. This module is the only place that
knows that, and how to give each run its own settings (``GEMINI_CLI_HOME`` under the attempt
directory, so ``~/.gemini`` is never written): the user's settings with the ``ask_human`` MCP
server registered and trusted on top.

Gemini puts no cost, no context window and no rate-limit event on stdout; its retries are logged
on stderr only. A 429 surfaces when the CLI gives up (``result.status == "error"``), so the
engine's inactivity timeout and wall-clock cap remain the guard against long retry loops.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
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

__all__ = ["EXIT_CODES", "GeminiCoder", "GeminiNormalizer"]

#: gemini-cli's exit codes (packages/core/src/utils/errors.ts, FatalError subclasses).
EXIT_CODES: dict[int, str] = {
    41: "authentication failed",
    42: "input error",
    44: "sandbox error",
    52: "configuration error",
    53: "session turn limit reached",
    54: "tool execution failed",
    55: "untrusted workspace",
    130: "cancelled",
    401 & 0xFF: "API rejected the credentials (HTTP 401)",
    403 & 0xFF: "API refused access (HTTP 403)",
    429 & 0xFF: "rate limited (HTTP 429)",
}
EXIT_AUTH = 41
#: A fatal API error exits with its HTTP status (``extractErrorCode`` -> ``process.exit(status)``),
#: which the parent sees modulo 256: 401 -> 145, 403 -> 147, 429 -> 173 (observed with 0.61).
EXIT_HTTP_AUTH = frozenset({401 & 0xFF, 403 & 0xFF})
EXIT_RATE_LIMITED = 429 & 0xFF
#: ``result.error.type`` values (error class names) that mean a quota / rate limit.
QUOTA_ERROR_TYPES = frozenset({"TerminalQuotaError", "RetryableQuotaError"})
#: ``result.error.type`` values that mean the credentials are missing or rejected.
AUTH_ERROR_TYPES = frozenset({"FatalAuthenticationError", "UnauthorizedError", "AccountSuspendedError"})
#: The advice gemini-cli's ``parseAndFormatApiError`` appends exactly when an API error's status
#: is 429 (errorParsing.ts: API key, Vertex, and the default/OAuth variant). Only used when the
#: error's structure says nothing (``error.type == "unknown"``); pinned in the tests.
RATE_LIMIT_ADVICE = (
    "Please wait and try again later. To increase your limits, request a quota increase",
    "Possible quota limitations in place or slow response times detected.",
)
#: How long one ask_human call may block (Gemini's default MCP timeout is 10 minutes); the
#: ask_human server answers "no answer" on its own expiry well before this.
MCP_TIMEOUT_MS = 7 * 24 * 3600 * 1000
#: What of the user's ~/.gemini a run links into its own (a login, context, commands, extensions).
_LINKED_USER_FILES = (
    "oauth_creds.json",
    "google_accounts.json",
    "installation_id",
    ".env",
    "GEMINI.md",
    "commands",
    "extensions",
    "agents",
    "skills",
    "policies",
)

_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?")
_RESET_AFTER = re.compile(r"(?:reset after|retry after|retry in)\s+([0-9hms.]+)", re.IGNORECASE)


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _int(v: Any) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def api_error_code(message: str | None) -> int | None:
    """The HTTP code of an API error the CLI embedded as JSON: ``[API Error: {"error":{"code":401,…}}]``."""
    if not message:
        return None
    start = message.find("{")
    end = message.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        obj = json.loads(message[start : end + 1])
    except ValueError:
        return None
    code = _dict(_dict(obj).get("error")).get("code")
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _reset_seconds(message: str) -> float | None:
    """``Your quota will reset after 2h24m55s.`` / ``Suggested retry after 1s.`` -> seconds."""
    m = _RESET_AFTER.search(message)
    if not m:
        return None
    d = _DURATION.fullmatch(m.group(1).rstrip("."))
    if not d or not any(d.groups()):
        return None
    h, mi, s = (float(x) if x else 0.0 for x in d.groups())
    return h * 3600 + mi * 60 + s


class GeminiNormalizer(BaseNormalizer):
    """Maps Gemini CLI stream-json lines to Events; one instance per attempt.

    * ``init`` -> ``session_started`` (``text`` is the model);
    * ``message`` with ``role:"assistant"`` arrives as deltas; consecutive deltas are joined into
      one ``text`` event, emitted when the next non-delta line arrives or when the runner calls
      ``poll`` (every tail tick), so a long answer is never held back for long. The prompt echo
      (``role:"user"``) is dropped;
    * ``tool_use`` -> ``tool_call``; ``tool_result`` -> ``tool_result`` paired by ``tool_id``;
    * ``error`` -> ``error`` (``is_error`` only for severity ``error``; loop warnings are not);
    * ``result`` -> ``usage`` (the session totals from ``stats``: Gemini reports no per-call usage
      and no context occupancy, so ``context_tokens`` stays None) then ``result``; a quota error
      also yields a ``rate_limit`` event.
    """

    def __init__(
        self, task_id: str, attempt: int, start_seq: int = 0, attempt_dir: Path | None = None
    ) -> None:
        super().__init__(task_id, attempt, start_seq)
        self.attempt_dir = attempt_dir
        self.session_id: str | None = None
        self.model: str | None = None
        #: the tools called and not answered yet, by call id: a result names its call's tool (and
        #: takes its entry out: an agent that runs for hours makes thousands of calls)
        self.tools: dict[str, str] = {}
        self.lines = 0
        self.result: dict[str, Any] | None = None
        self.fatal_errors: list[str] = []
        self.usage: Usage | None = None
        self._pending: list[str] = []
        self._pending_ts = 0.0
        self._turn_text: list[str] = []  # assistant text since the last tool call

    # -- feeding -------------------------------------------------------------------------

    def feed(self, line: str, ts: float) -> list[Event]:
        obj = self.parse_json(line)
        if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
            return self._flush() + self.fallback(line, ts)
        self.lines += 1
        try:
            return self._feed(obj, ts)
        except Exception:  # a field of an unexpected type: keep the line, never raise
            return [*self._flush(), self.ev(ts, "text", text=line.strip(), raw=obj)]

    def poll(self, ts: float) -> list[Event]:
        """Emit the assistant text buffered so far (called on every tail tick and at the end)."""
        return self._flush()

    def _flush(self) -> list[Event]:
        if not self._pending:
            return []
        text = "".join(self._pending)
        self._pending = []
        return [self.ev(self._pending_ts, "text", text=text, session_id=self.session_id)]

    def _feed(self, obj: dict[str, Any], ts: float) -> list[Event]:
        kind = obj["type"]
        if kind == "message":
            if obj.get("role") != "assistant":
                return []  # the prompt echo
            content = obj.get("content")
            if isinstance(content, str) and content:
                if not self._pending:
                    self._pending_ts = ts
                self._pending.append(content)
                self._turn_text.append(content)
            return []
        out = self._flush()
        if kind == "init":
            sid = obj.get("session_id")
            self.session_id = sid if isinstance(sid, str) else self.session_id
            model = obj.get("model")
            self.model = model if isinstance(model, str) else self.model
            out.append(self.ev(ts, "session_started", session_id=self.session_id, text=self.model, raw=obj))
        elif kind == "tool_use":
            tool_id = obj.get("tool_id")
            tid = str(tool_id) if tool_id is not None else None
            name = str(obj.get("tool_name") or "tool")
            if tid:
                self.tools[tid] = name
            self._turn_text = []
            out.append(
                self.ev(ts, "tool_call", tool=name, tool_input=obj.get("parameters"), tool_id=tid, raw=obj)
            )
        elif kind == "tool_result":
            tool_id = obj.get("tool_id")
            tid = str(tool_id) if tool_id is not None else None
            is_error = obj.get("status") == "error"
            err = _dict(obj.get("error"))
            body = err.get("message") if is_error else obj.get("output")
            text = body if isinstance(body, str) else ("" if body is None else json.dumps(body))
            if is_error and err.get("type") and text:
                text = f"{err['type']}: {text}"
            out.append(
                self.ev(
                    ts, "tool_result", tool=self.tools.pop(tid or "", None), tool_id=tid, text=text,
                    is_error=is_error, raw=obj,
                )
            )  # fmt: skip
        elif kind == "error":
            severity = obj.get("severity")
            message = obj.get("message")
            text = message if isinstance(message, str) else json.dumps(obj)
            is_error = severity != "warning"
            if is_error:
                self.fatal_errors.append(text)
            out.append(self.ev(ts, "error", text=text, is_error=is_error, raw=obj))
        elif kind == "result":
            out.extend(self._result(obj, ts))
        else:  # an event type this version does not know: keep it visible, unparsed
            out.append(self.ev(ts, "lifecycle", text=f"gemini: {kind}", raw=obj))
        return out

    def _result(self, obj: dict[str, Any], ts: float) -> list[Event]:
        self.result = obj
        out: list[Event] = []
        stats = _dict(obj.get("stats"))
        if stats:
            prompt = _int(stats.get("input_tokens"))
            cached = _int(stats.get("cached"))
            fresh = _int(stats.get("input")) if "input" in stats else max(0, prompt - cached)
            self.usage = Usage(
                input_tokens=fresh, output_tokens=_int(stats.get("output_tokens")), cache_read_tokens=cached
            )
            if self.usage.total:
                out.append(self.ev(ts, "usage", usage=self.usage, session_id=self.session_id, raw=stats))
        is_error = obj.get("status") != "success"
        err = _dict(obj.get("error"))
        message = err.get("message") if isinstance(err.get("message"), str) else None
        if is_error:
            text = message or str(err.get("type") or "gemini reported an error")
        else:
            text = "".join(self._turn_text)
        self.result_text = text
        self.result_is_error = is_error
        if is_error and self._is_rate_limit(err):
            resets = _reset_seconds(message or "")
            rl = RateLimit(
                account="gemini", status="rejected",
                resets_at=ts + resets if resets is not None else None, observed_at=ts,
            )  # fmt: skip
            self.rate_limit = rl
            out.append(self.ev(ts, "rate_limit", rate_limit=rl, text=message, session_id=self.session_id))
        out.append(self.ev(ts, "result", text=text, is_error=is_error, session_id=self.session_id, raw=obj))
        return out

    @staticmethod
    def _is_rate_limit(err: dict[str, Any]) -> bool:
        if isinstance(err.get("type"), str) and err["type"] in QUOTA_ERROR_TYPES:
            return True
        message = err.get("message")
        if isinstance(message, str) and api_error_code(message) == 429:
            return True
        # a structured 429 (type "unknown"): the CLI appended its 429 advice to the message
        return isinstance(message, str) and any(a in message for a in RATE_LIMIT_ADVICE)

    # -- the end ---------------------------------------------------------------------------

    def outcome(self, exit_code: int | None) -> Outcome:
        """Classified from structure: ``result.status``, ``error.type`` (the error class) or the
        HTTP code embedded in its message, severity-``error`` events, and the exit code (41 auth,
        145/147 = HTTP 401/403, 173 = HTTP 429, other FatalError codes). The CLI's 429 advice text
        is the last resort for a structured 429 whose message carries no JSON.
        """
        common: dict[str, Any] = {"result_text": self.result_text}
        err = _dict(self.result.get("error")) if self.result else {}
        etype = err.get("type") if isinstance(err.get("type"), str) else None
        message = err.get("message") if isinstance(err.get("message"), str) else None
        resets = self.rate_limit.resets_at if self.rate_limit else None
        code = api_error_code(message)
        if exit_code == EXIT_AUTH or etype in AUTH_ERROR_TYPES or code in (401, 403):
            detail = message or "gemini exited 41: authentication failed (no auth method or bad key)"
            return Outcome("auth_failed", detail, **common)
        if exit_code in EXIT_HTTP_AUTH and (self.result is None or self.result_is_error):
            return Outcome("auth_failed", message or EXIT_CODES[exit_code], **common)
        if exit_code == EXIT_RATE_LIMITED or (self.result_is_error and self._is_rate_limit(err)):
            return Outcome(
                "rate_limited", message or EXIT_CODES[EXIT_RATE_LIMITED], resets_at=resets, **common
            )
        if self.result is not None and self.result_is_error:
            detail = f"{etype}: {message}" if etype and message else (message or str(etype or "error"))
            return Outcome("failure", detail, **common)
        if exit_code is None:
            return Outcome("failure", "gemini did not report an exit status", **common)
        if exit_code != 0:
            what = EXIT_CODES.get(exit_code)
            detail = f"gemini exited {exit_code}" + (f": {what}" if what else "")
            if self.fatal_errors:
                detail += f" ({self.fatal_errors[-1]})"
            return Outcome("failure", detail, **common)
        if self.result is None:
            what = "no output" if self.lines == 0 else "no result line"
            return Outcome("failure", f"gemini exited 0 with {what}", **common)
        if self.fatal_errors:  # e.g. "Maximum session turns exceeded", then status success
            return Outcome("failure", self.fatal_errors[-1], **common)
        return Outcome("success", "", claimed_success=True, **common)


class GeminiCoder(BaseCoder):
    """``gemini --output-format stream-json --approval-mode yolo --skip-trust``, prompt on stdin.

    The run gets its own ``GEMINI_CLI_HOME`` (so Gemini's chats, logs and caches never land in
    the user's ``~/.gemini``) whose ``settings.json`` (0600) is the user's own settings with what
    an unattended run needs merged on top: no auto-update or telemetry, an auth type, and fleet's
    ``ask_human`` server next to the user's ``mcpServers`` (left out with ``mcp =
    "fleet-only"``, which also passes ``--allowed-mcp-server-names ask_human`` so extensions'
    servers stay off). The user's login, ``.env``, GEMINI.md, commands, extensions and the like
    are linked in. The prompt goes on stdin (Gemini reads piped input as the prompt): no ARG_MAX
    limit, and it never shows in ``ps``.
    """

    name: ClassVar[str] = "gemini"
    program: ClassVar[str | None] = "gemini"
    install_hint: ClassVar[str] = "npm install -g @google/gemini-cli"
    #: the user's Google login (symlinked into the run; a refreshed token is written back)
    sandbox_state: ClassVar[tuple[str, ...]] = ("~/.gemini/",)

    @staticmethod
    def cli_home(ctx: AttemptContext) -> Path:
        return ctx.attempt_dir / "gemini" / "home"

    @classmethod
    def settings_path(cls, ctx: AttemptContext) -> Path:
        return cls.cli_home(ctx) / ".gemini" / "settings.json"

    def argv(self, ctx: AttemptContext) -> list[str]:
        cmd = ["gemini", "--output-format", "stream-json"]
        if ctx.model:
            cmd += ["--model", ctx.model]
        cmd += ["--approval-mode", "yolo", "--skip-trust"]
        if not ctx.user_mcp:
            cmd += ["--allowed-mcp-server-names", "ask_human"]
        return cmd

    def stdin(self, ctx: AttemptContext) -> bytes | None:
        return ctx.prompt.encode("utf-8")

    can_resume: ClassVar[bool] = True

    def resume_argv(self, ctx: AttemptContext, session_id: str, previous: Path) -> list[str]:
        """``gemini --resume <id>``: the chats live in the run's own GEMINI_CLI_HOME, copied from
        the previous run's (``.gemini/tmp/<project>/chats``, ``projects.json``)."""
        old = previous / "gemini" / "home" / ".gemini"
        if not any((old / "tmp").glob(f"*/chats/session-*{session_id[:8]}*")):
            raise CannotResume(f"gemini session {session_id} not found (its chat file is gone)")
        new = self.cli_home(ctx) / ".gemini"
        new.mkdir(parents=True, exist_ok=True)
        for name in ("tmp", "history"):
            if (old / name).is_dir():
                shutil.copytree(old / name, new / name, dirs_exist_ok=True)
        if (old / "projects.json").is_file():
            shutil.copy2(old / "projects.json", new / "projects.json")
        return [*self.argv(ctx), "--resume", session_id]

    def env(self, ctx: AttemptContext) -> dict[str, str]:
        return {
            "GEMINI_CLI_HOME": str(self.cli_home(ctx)),
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
            "PWD": str(ctx.workdir),
        }

    @staticmethod
    def user_gemini_dir() -> Path:
        home = os.environ.get("GEMINI_CLI_HOME")
        return (Path(home) if home else Path.home()) / ".gemini"

    @classmethod
    def user_settings(cls) -> dict[str, Any]:
        text = read_text(cls.user_gemini_dir() / "settings.json")
        if text is None:
            return {}
        try:
            return _dict(json.loads(text))
        except ValueError:
            return {}

    @staticmethod
    def auth_type(user_settings: dict[str, Any], env: Mapping[str, str]) -> str | None:
        """The auth method to configure: the user's own choice, else one derived from env.

        Needed because gemini-cli 0.61 derives the auth type ``gateway`` from
        ``GOOGLE_GEMINI_BASE_URL`` and then rejects it as "Invalid auth method selected." (exit
        41) unless the settings name one.
        """
        selected = _dict(_dict(user_settings.get("security")).get("auth")).get("selectedType")
        if not isinstance(selected, str):
            selected = user_settings.get("selectedAuthType")  # pre-0.3 settings layout
        if isinstance(selected, str) and selected:
            return selected
        if env.get("GOOGLE_GENAI_USE_GCA") == "true":
            return "oauth-personal"
        if env.get("GOOGLE_GENAI_USE_VERTEXAI") == "true":
            return "vertex-ai"
        if env.get("GEMINI_API_KEY"):
            return "gemini-api-key"
        return None

    def runtime_settings(
        self, ctx: AttemptContext, user_settings: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The per-run ``settings.json``: the user's settings with the run's needs on top."""
        settings: dict[str, Any] = json.loads(json.dumps(user_settings or {}))  # a deep copy
        for section, values in (
            ("general", {"enableAutoUpdate": False, "enableAutoUpdateNotification": False}),
            ("privacy", {"usageStatisticsEnabled": False}),
            ("telemetry", {"enabled": False}),
        ):
            settings[section] = {**_dict(settings.get(section)), **values}
        env = {**os.environ, **dict(ctx.task.spec.env)}  # what the agent will run with
        auth = self.auth_type(user_settings or {}, env)
        if auth:
            security = _dict(settings.get("security"))
            security["auth"] = {**_dict(security.get("auth")), "selectedType": auth}
            settings["security"] = security
        servers = _dict(settings.get("mcpServers")) if ctx.user_mcp else {}
        if ctx.mcp_command:
            servers["ask_human"] = {
                "command": ctx.mcp_command[0],
                "args": list(ctx.mcp_command[1:]),
                "env": dict(ctx.mcp_env),
                "trust": True,  # headless turns ASK_USER into DENY; trust lets it run
                "timeout": MCP_TIMEOUT_MS,
            }
            mcp = _dict(settings.get("mcp"))
            if isinstance(mcp.get("allowed"), list) and "ask_human" not in mcp["allowed"]:
                mcp["allowed"] = [*mcp["allowed"], "ask_human"]
            if isinstance(mcp.get("excluded"), list):
                mcp["excluded"] = [x for x in mcp["excluded"] if x != "ask_human"]
            if mcp:
                settings["mcp"] = mcp
        if servers:
            settings["mcpServers"] = servers
        else:
            settings.pop("mcpServers", None)
        return settings

    def prepare(self, ctx: AttemptContext) -> None:
        user_dir = self.user_gemini_dir()
        path = self.settings_path(ctx)
        write_private(path, json.dumps(self.runtime_settings(ctx, self.user_settings()), indent=2) + "\n")
        # a Google login lives in ~/.gemini: link it (token refreshes then reach the user's copy)
        link_user_files(user_dir, path.parent, _LINKED_USER_FILES)

    def setup(self, user_mcp: bool = True) -> Setup:
        path = self.user_gemini_dir() / "settings.json"
        files = (str(path),) if path.is_file() else ()
        settings = self.user_settings()
        servers = sorted(str(k) for k in _dict(settings.get("mcpServers")) if k != "ask_human")
        raw = settings.get("model")
        model = os.environ.get("GEMINI_MODEL") or (_dict(raw).get("name") if isinstance(raw, dict) else raw)
        notes = () if user_mcp else ("mcp = fleet-only: the user's MCP servers are off",)
        shown = str(model) if isinstance(model, str) and model else "Gemini CLI's default"
        return Setup(files, (*(servers if user_mcp else []), "ask_human"), shown, notes)

    def normalizer(
        self, task_id: str, attempt: int, start_seq: int = 0, attempt_dir: Path | None = None
    ) -> GeminiNormalizer:
        return GeminiNormalizer(task_id, attempt, start_seq, attempt_dir)
