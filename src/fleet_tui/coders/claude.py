"""Claude Code (`claude -p --output-format stream-json --verbose`) as a fleet coder.

Why: this is the one place that knows Claude Code's flags, its per-run MCP registration and its
stream-json output (see tests/fixtures/FORMATS.md section 1). The engine only sees the Coder
protocol and normalized Events.

Traps handled here (DESIGN section 6): an API failure is reported as ``subtype:"success"`` with
``is_error:true`` (failure is decided from ``is_error`` and ``api_error_status``, never from
``subtype``); one API message spans several lines with the same ``message.id`` (usage is counted
once per id); ``--dangerously-skip-permissions`` is refused as root unless ``IS_SANDBOX=1``;
per-message ``output_tokens`` in stream-json are stale, so the ``result`` line's query totals
reconcile the usage sum.
"""

from __future__ import annotations

import json
import os
import shutil
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

#: Claude's context window unless the stream says otherwise (``modelUsage[m].contextWindow``).
DEFAULT_CONTEXT_WINDOW = 200_000
#: how long (ms) Claude Code lets an MCP tool call run: ask_human blocks until a human answers
MCP_TOOL_TIMEOUT_MS = 7 * 24 * 3600 * 1000
ASK_HUMAN_TOOL = "mcp__ask_human__ask_human"
#: message ids a normalizer remembers to count each message's usage once. Claude Code writes a
#: message's id on the line of each of its content blocks, one after another (a subagent's lines
#: may come between): the latest ids are enough. Every id of the attempt was kept before, one per
#: line of an agent that writes a message a line: 130 bytes a line, without bound
SEEN_MESSAGES = 1024
#: environment variables that mean Claude Code authenticates without the user's login
_API_CREDENTIAL_VARS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN")
#: what of the user's config dir a run with its own CLAUDE_CONFIG_DIR links to (read by the CLI)
_LINKED_USER_FILES = ("CLAUDE.md", "agents", "commands", "skills", "output-styles")


def context_window_for(model: str | None) -> int:
    """The context window to assume for ``model`` before the stream reports one."""
    if model and "[1m]" in model.lower():
        return 1_000_000
    return DEFAULT_CONTEXT_WINDOW


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def usage_of(u: Any) -> Usage:
    """An Anthropic ``usage`` object as a Usage (missing or odd fields count as 0)."""
    if not isinstance(u, dict):
        return Usage()
    return Usage(
        input_tokens=_int(u.get("input_tokens")),
        output_tokens=_int(u.get("output_tokens")),
        cache_read_tokens=_int(u.get("cache_read_input_tokens")),
        cache_creation_tokens=_int(u.get("cache_creation_input_tokens")),
    )


def _add(a: Usage, b: Usage) -> Usage:
    return Usage(
        a.input_tokens + b.input_tokens,
        a.output_tokens + b.output_tokens,
        a.cache_read_tokens + b.cache_read_tokens,
        a.cache_creation_tokens + b.cache_creation_tokens,
    )


def _remainder(total: Usage, counted: Usage) -> Usage:
    """What ``total`` has beyond ``counted``, field by field, never negative."""
    return Usage(
        max(0, total.input_tokens - counted.input_tokens),
        max(0, total.output_tokens - counted.output_tokens),
        max(0, total.cache_read_tokens - counted.cache_read_tokens),
        max(0, total.cache_creation_tokens - counted.cache_creation_tokens),
    )


def tool_result_text(content: Any) -> str:
    """A tool_result ``content`` (a string or a block list) as text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for b in content:
            if isinstance(b, dict):
                if b.get("type") == "text" and isinstance(b.get("text"), str):
                    parts.append(b["text"])
                elif b.get("type"):
                    parts.append(f"[{b['type']}]")
            elif isinstance(b, str):
                parts.append(b)
        return "\n".join(parts)
    if content is None:
        return ""
    return json.dumps(content)


def _status(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.isdigit():
        return int(v)
    return None


class ClaudeNormalizer(BaseNormalizer):
    """Claude Code stream-json lines -> Events; classifies the attempt from what it saw."""

    def __init__(
        self, task_id: str, attempt: int, start_seq: int = 0, attempt_dir: Path | None = None
    ) -> None:
        super().__init__(task_id, attempt, start_seq)
        self.attempt_dir = attempt_dir
        self.session_id: str | None = None
        self.model: str | None = None
        self.context_window: int | None = None
        self.context_tokens: int | None = None
        #: the ids of the latest messages whose usage was counted (``SEEN_MESSAGES`` at most)
        self._seen_messages: dict[str, None] = {}
        self._counted = Usage()
        self.saw_result = False
        self.result: dict[str, Any] = {}
        self.assistant_error: str | None = None  # assistant.error: rate_limit, authentication_failed...
        self.last_retry: dict[str, Any] | None = None  # the latest system/api_retry line
        self.retries = 0

    # -- feeding ---------------------------------------------------------------------------

    def feed(self, line: str, ts: float) -> list[Event]:
        obj = self.parse_json(line)
        if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
            return self.fallback(line, ts)
        try:
            return self._dispatch(obj, ts)
        except Exception:  # a shape we did not foresee must not stop the run's event stream
            return [self.ev(ts, "text", text=line, raw=obj)]

    def _dispatch(self, obj: dict[str, Any], ts: float) -> list[Event]:
        t = obj["type"]
        if t == "system":
            return self._system(obj, ts)
        if t == "assistant":
            return self._assistant(obj, ts)
        if t == "user":
            return self._user(obj, ts)
        if t == "rate_limit_event":
            return self._rate_limit(obj, ts)
        if t == "result":
            return self._result(obj, ts)
        # stream_event (--include-partial-messages): the complete assistant line follows with the
        # same content, so partial deltas add nothing (and would duplicate text).
        return []

    def _system(self, obj: dict[str, Any], ts: float) -> list[Event]:
        sub = obj.get("subtype")
        if sub == "init":
            self.session_id = obj.get("session_id") or self.session_id
            self.model = obj.get("model") or self.model
            if self.context_window is None:
                self.context_window = context_window_for(self.model)
            return [self.ev(ts, "session_started", session_id=self.session_id, text=self.model, raw=obj)]
        if sub == "api_retry":
            self.last_retry = obj
            self.retries += 1
            status = _status(obj.get("error_status"))
            text = (
                f"API error {status if status is not None else '?'} ({obj.get('error') or 'unknown'}); "
                f"retry {obj.get('attempt')}/{obj.get('max_retries')} in {obj.get('retry_delay_ms')} ms"
            )
            return [self.ev(ts, "api_retry", text=text, is_error=True, raw=obj)]
        if sub == "compact_boundary":
            return [self.ev(ts, "lifecycle", text="context compacted", raw=obj)]
        return []  # status, task_*, hook_*: progress we do not show

    def _assistant(self, obj: dict[str, Any], ts: float) -> list[Event]:
        msg = obj.get("message") if isinstance(obj.get("message"), dict) else {}
        assert isinstance(msg, dict)
        out: list[Event] = []
        err = obj.get("error")
        if isinstance(err, str) and err:
            self.assistant_error = err
        for block in msg.get("content") or []:
            if not isinstance(block, dict):
                continue
            bt = block.get("type")
            if bt == "text" and block.get("text"):
                if err:  # a synthetic error message ("API Error: ...", "Not logged in ...")
                    out.append(self.ev(ts, "error", text=block["text"], is_error=True, raw=obj))
                else:
                    out.append(self.ev(ts, "text", text=block["text"]))
            elif bt == "thinking" and block.get("thinking"):
                out.append(self.ev(ts, "thinking", text=block["thinking"]))
            elif bt in ("tool_use", "server_tool_use"):
                out.append(
                    self.ev(
                        ts,
                        "tool_call",
                        tool=block.get("name"),
                        tool_input=block.get("input"),
                        tool_id=block.get("id"),
                    )
                )
        if err and not out:
            out.append(self.ev(ts, "error", text=str(err), is_error=True, raw=obj))
        mid = msg.get("id")
        if isinstance(mid, str) and mid not in self._seen_messages and "usage" in msg:
            self._seen_messages[mid] = None
            if len(self._seen_messages) > SEEN_MESSAGES:
                del self._seen_messages[next(iter(self._seen_messages))]  # the oldest
            usage = usage_of(msg.get("usage"))
            if usage.total or not err:
                self._counted = _add(self._counted, usage)
                if obj.get("parent_tool_use_id") is None and usage.total:
                    self.context_tokens = (
                        usage.input_tokens + usage.cache_read_tokens + usage.cache_creation_tokens
                    )
                out.append(
                    self.ev(
                        ts,
                        "usage",
                        usage=usage,
                        context_tokens=self.context_tokens,
                        context_window=self.context_window,
                    )
                )
        return out

    def _user(self, obj: dict[str, Any], ts: float) -> list[Event]:
        msg = obj.get("message") if isinstance(obj.get("message"), dict) else {}
        assert isinstance(msg, dict)
        content = msg.get("content")
        if not isinstance(content, list):
            return []
        out: list[Event] = []
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                out.append(
                    self.ev(
                        ts,
                        "tool_result",
                        tool_id=block.get("tool_use_id"),
                        text=tool_result_text(block.get("content")),
                        is_error=bool(block.get("is_error")),
                    )
                )
        return out

    def _rate_limit(self, obj: dict[str, Any], ts: float) -> list[Event]:
        info = obj.get("rate_limit_info") if isinstance(obj.get("rate_limit_info"), dict) else {}
        assert isinstance(info, dict)
        util = info.get("utilization")
        resets = info.get("resetsAt")
        rl = RateLimit(
            account="claude",
            status=str(info.get("status") or "unknown"),
            utilization=float(util) if isinstance(util, int | float) else None,
            resets_at=float(resets) if isinstance(resets, int | float) else None,
            window=info.get("rateLimitType") if isinstance(info.get("rateLimitType"), str) else None,
            observed_at=ts,
        )
        self.rate_limit = rl
        return [self.ev(ts, "rate_limit", rate_limit=rl, text=rl.status, raw=obj)]

    def _result(self, obj: dict[str, Any], ts: float) -> list[Event]:
        self.saw_result = True
        self.result = obj
        is_error = obj.get("is_error") is True
        text = obj.get("result")
        if not isinstance(text, str):
            errs = obj.get("errors")
            text = "; ".join(str(e) for e in errs) if isinstance(errs, list) and errs else None
        cost = obj.get("total_cost_usd")
        self.cost_usd = float(cost) if isinstance(cost, int | float) else self.cost_usd
        self.result_text = text
        self.result_is_error = is_error
        self.session_id = obj.get("session_id") or self.session_id
        out: list[Event] = []
        window = self._window_from(obj.get("modelUsage"))
        if window is not None:
            self.context_window = window
        # per-message output_tokens in stream-json are stale; the query totals settle the sum
        rest = _remainder(usage_of(obj.get("usage")), self._counted)
        if rest.total or window is not None:
            self._counted = _add(self._counted, rest)
            out.append(
                self.ev(
                    ts,
                    "usage",
                    usage=rest,
                    context_tokens=self.context_tokens,
                    context_window=self.context_window,
                    raw={"reconciled_from": "result.usage"},
                )
            )
        out.append(
            self.ev(
                ts,
                "result",
                text=text,
                is_error=is_error,
                cost_usd=self.cost_usd,
                session_id=self.session_id,
                raw=obj,
            )
        )
        return out

    def _window_from(self, model_usage: Any) -> int | None:
        if not isinstance(model_usage, dict) or not model_usage:
            return None
        entry = model_usage.get(self.model) if self.model in model_usage else None
        if not isinstance(entry, dict):
            windows = [v.get("contextWindow") for v in model_usage.values() if isinstance(v, dict)]
            ints = [w for w in windows if isinstance(w, int) and w > 0]
            return max(ints) if ints else None
        w = entry.get("contextWindow")
        return w if isinstance(w, int) and w > 0 else None

    # -- classification --------------------------------------------------------------------

    @property
    def total_usage(self) -> Usage:
        """The sum of every usage event emitted so far."""
        return self._counted

    def outcome(self, exit_code: int | None) -> Outcome:
        r = self.result
        common: dict[str, Any] = {"result_text": self.result_text, "cost_usd": self.cost_usd}
        resets = self.rate_limit.resets_at if self.rate_limit else None
        rejected = self.rate_limit is not None and self.rate_limit.status == "rejected"
        if self.saw_result and not self.result_is_error:
            return Outcome("success", "", claimed_success=True, **common)
        status = _status(r.get("api_error_status"))
        etype = r.get("api_error_type") if isinstance(r.get("api_error_type"), str) else ""
        if self.saw_result:
            text = self.result_text or ""
            limited = status == 429 or etype == "rate_limit_error" or self.assistant_error == "rate_limit"
            if rejected or limited:
                return Outcome("rate_limited", text or "rate limited (429)", resets_at=resets, **common)
            if (
                status in (401, 403)
                or etype in ("authentication_error", "permission_error")
                or self.assistant_error in ("authentication_failed", "billing_error")
            ):
                return Outcome("auth_failed", text or f"authentication failed ({status})", **common)
            if r.get("terminal_reason") == "blocking_limit" or etype == "request_too_large":
                return Outcome("context_pressure", text or "context window full", **common)
            sub = r.get("subtype")
            detail = text or f"{sub or 'error'} (terminal_reason {r.get('terminal_reason')})"
            return Outcome("failure", detail, **common)
        # no result line: killed, crashed, or still retrying when stopped
        if rejected:
            return Outcome("rate_limited", "rate limit rejected", resets_at=resets, **common)
        if self.last_retry is not None:
            st = _status(self.last_retry.get("error_status"))
            kind = self.last_retry.get("error")
            if st == 429 or kind == "rate_limit":
                return Outcome(
                    "rate_limited", f"stopped while retrying a 429 ({self.retries} retries)", **common
                )
            if st in (401, 403) or kind == "authentication_failed":
                return Outcome("auth_failed", f"stopped while retrying a {st}", **common)
        if self.assistant_error == "rate_limit":
            return Outcome("rate_limited", "rate limited", resets_at=resets, **common)
        if self.assistant_error in ("authentication_failed", "billing_error"):
            return Outcome("auth_failed", self.assistant_error, **common)
        if exit_code is None:
            return Outcome("failure", "ended without a result line", **common)
        return Outcome("failure", f"exited {exit_code} without a result line", **common)


class ClaudeCoder(BaseCoder):
    """Builds the ``claude -p`` command line, its environment and its per-run MCP config.

    The user's own setup stays: their settings, default model and MCP servers (``claude mcp add
    --scope user``, project ``.mcp.json``) are loaded by Claude Code itself, and ``--mcp-config``
    adds fleet's ``ask_human`` on top (``--strict-mcp-config`` only with ``mcp = "fleet-only"``).
    When Claude Code authenticates from the environment (an API key or token), the run gets its
    own ``CLAUDE_CONFIG_DIR`` holding private copies of the user's ``.claude.json`` and
    ``settings.json`` and links to their CLAUDE.md, agents, commands and skills, so the CLI's
    own state writes (sessions, counters) never land in the user's files.
    """

    name: ClassVar[str] = "claude"
    program: ClassVar[str | None] = "claude"
    install_hint: ClassVar[str] = "npm install -g @anthropic-ai/claude-code"
    #: the user's config dir and file (used with a subscription login; an API key gets its own)
    sandbox_state: ClassVar[tuple[str, ...]] = ("~/.claude/", "~/.claude.json")

    @staticmethod
    def mcp_config_path(ctx: AttemptContext) -> Path:
        return ctx.attempt_dir / "mcp.json"

    @staticmethod
    def config_dir(ctx: AttemptContext) -> Path:
        return ctx.attempt_dir / "claude_config"

    @staticmethod
    def user_config_dir() -> Path:
        """The user's Claude Code config dir (``$CLAUDE_CONFIG_DIR``, else ``~/.claude``)."""
        d = os.environ.get("CLAUDE_CONFIG_DIR")
        return Path(d) if d else Path.home() / ".claude"

    @classmethod
    def user_state_file(cls) -> Path:
        """The user's ``.claude.json`` (user-scope MCP servers, per-project settings)."""
        d = os.environ.get("CLAUDE_CONFIG_DIR")
        return Path(d) / ".claude.json" if d else Path.home() / ".claude.json"

    def argv(self, ctx: AttemptContext) -> list[str]:
        # The prompt goes on stdin: --mcp-config and --allowedTools take several values and
        # would swallow a positional prompt, and stdin has no ARG_MAX limit.
        args = [self.program or "claude", "-p", "--output-format", "stream-json", "--verbose"]
        if ctx.model:
            args += ["--model", ctx.model]
        args.append("--dangerously-skip-permissions")
        if ctx.mcp_command:
            args += ["--mcp-config", str(self.mcp_config_path(ctx))]
            if not ctx.user_mcp:
                args.append("--strict-mcp-config")
            args += ["--allowedTools", ASK_HUMAN_TOOL]
        elif not ctx.user_mcp:
            args += ["--strict-mcp-config"]
        return args

    def isolates_config(self, ctx: AttemptContext) -> bool:
        """Whether this run gets its own CLAUDE_CONFIG_DIR under the attempt directory.

        Only when Claude Code authenticates from the environment (an API key or token): a
        subscription login lives in the user's config dir, and a copy would diverge from it
        when its OAuth token is refreshed.
        """
        spec_env = dict(ctx.task.spec.env)
        return any(os.environ.get(v) or spec_env.get(v) for v in _API_CREDENTIAL_VARS)

    def env(self, ctx: AttemptContext) -> dict[str, str]:
        env = {
            "IS_SANDBOX": "1",  # --dangerously-skip-permissions is refused as root without it
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "MCP_TOOL_TIMEOUT": str(MCP_TOOL_TIMEOUT_MS),
        }
        if self.isolates_config(ctx):
            env["CLAUDE_CONFIG_DIR"] = str(self.config_dir(ctx))
        return env

    def stdin(self, ctx: AttemptContext) -> bytes | None:
        return ctx.prompt.encode("utf-8")

    def prepare(self, ctx: AttemptContext) -> None:
        ctx.attempt_dir.mkdir(parents=True, exist_ok=True)
        if self.isolates_config(ctx):
            self._copy_user_config(self.config_dir(ctx))
        if ctx.mcp_command:
            server: dict[str, Any] = {
                "type": "stdio",
                "command": ctx.mcp_command[0],
                "args": list(ctx.mcp_command[1:]),
                "env": dict(ctx.mcp_env),
            }
            data = json.dumps({"mcpServers": {"ask_human": server}}, indent=2)
            write_private(self.mcp_config_path(ctx), data + "\n")

    def _copy_user_config(self, dst: Path) -> None:
        """Private copies (0600) of the user's .claude.json and settings, links to the rest."""
        dst.mkdir(parents=True, exist_ok=True)
        for src, name in (
            (self.user_state_file(), ".claude.json"),
            (self.user_config_dir() / "settings.json", "settings.json"),
        ):
            text = read_text(src)
            if text is not None and not (dst / name).exists():
                write_private(dst / name, text)
        link_user_files(self.user_config_dir(), dst, _LINKED_USER_FILES)

    def setup(self, user_mcp: bool = True) -> Setup:
        files: list[str] = []
        servers: list[str] = []
        model = os.environ.get("ANTHROPIC_MODEL") or None
        state = self.user_state_file()
        text = read_text(state)
        if text is not None:
            files.append(str(state))
            try:
                data = json.loads(text)
            except ValueError:
                data = {}
            if user_mcp and isinstance(data, dict) and isinstance(data.get("mcpServers"), dict):
                servers += sorted(data["mcpServers"])
        settings = self.user_config_dir() / "settings.json"
        text = read_text(settings)
        if text is not None:
            files.append(str(settings))
            try:
                data = json.loads(text)
            except ValueError:
                data = {}
            if isinstance(data, dict) and isinstance(data.get("model"), str) and not model:
                model = data["model"]
        notes = () if user_mcp else ("mcp = fleet-only: the user's MCP servers are off",)
        return Setup(tuple(files), (*servers, "ask_human"), model or "Claude Code's default", notes)

    can_resume: ClassVar[bool] = True

    def resume_argv(self, ctx: AttemptContext, session_id: str, previous: Path) -> list[str]:
        """``claude -p ... --resume <id>``: the session's transcript lives under the config dir's
        ``projects/<cwd>/<id>.jsonl``; an isolated run gets a copy of the previous run's."""
        name = f"{session_id}.jsonl"
        if self.isolates_config(ctx):
            found = sorted((previous / "claude_config" / "projects").glob(f"*/{name}"))
            for f in found:
                dst = self.config_dir(ctx) / "projects" / f.parent.name
                dst.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, dst / name)
                side = f.parent / session_id  # subagent transcripts and large tool results
                if side.is_dir():
                    shutil.copytree(side, dst / session_id, dirs_exist_ok=True)
        else:
            root = Path(os.environ.get("CLAUDE_CONFIG_DIR") or Path.home() / ".claude")
            found = sorted((root / "projects").glob(f"*/{name}"))
        if not found:
            raise CannotResume(f"claude session {session_id} not found (its transcript is gone)")
        return [*self.argv(ctx), "--resume", session_id]

    def interactive_argv(self, session_id: str | None, attempt_dir: Path) -> tuple[list[str], dict[str, str]]:
        """``claude --resume <id>`` in the run's own config dir when it had one."""
        if not session_id:
            raise CannotResume("no claude session id was recorded for this task")
        own = attempt_dir / "claude_config"
        env = {"CLAUDE_CONFIG_DIR": str(own)} if own.is_dir() else {}
        return [self.program or "claude", "--resume", session_id], env

    def normalizer(
        self, task_id: str, attempt: int, start_seq: int = 0, attempt_dir: Path | None = None
    ) -> ClaudeNormalizer:
        return ClaudeNormalizer(task_id, attempt, start_seq, attempt_dir)
