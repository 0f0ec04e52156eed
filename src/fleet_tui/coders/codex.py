"""OpenAI Codex CLI (`codex exec --json`) as a fleet coder.

Why: this is the one place that knows Codex's flags, its per-run ``CODEX_HOME`` (config.toml
with the ask_human MCP server) and its two outputs (see tests/fixtures/FORMATS.md section 2):

- stdout JSONL (``thread.started``, ``item.*``, ``turn.completed``/``turn.failed``, ``error``)
  carries text, tool calls and the turn's cumulative usage, but no cost, no rate limits and no
  context window;
- the rollout file ``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl`` carries ``token_count``
  events (rate limits, context window, per-call usage) and, on failure, a structured
  ``codex_error_info`` (``response_too_many_failed_attempts{http_status_code}``,
  ``usage_limit_exceeded``, ``http_connection_failed{http_status_code}``...). ``poll()`` reads it
  incrementally; the outcome prefers it over the wording of the stdout error.

Usage events carry increments: their sum is the run's total whichever source reported first.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

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

if TYPE_CHECKING:
    import tomlkit

#: the longest input Codex accepts (0.171: "Input exceeds the maximum length of 1048576 characters")
MAX_INPUT_CHARS = 1 << 20
#: seconds Codex lets the ask_human MCP tool run (it blocks until a human answers)
MCP_TOOL_TIMEOUT_SEC = 7 * 24 * 3600
#: what of the user's CODEX_HOME a run links into its own (read by Codex, never written)
_LINKED_USER_FILES = ("AGENTS.md", "AGENTS.override.md", "prompts", "skills", "rules")
#: "Reconnecting... 2/5 (<cause>)": a retry notice, not a terminal error (codex 0.171 wording)
_RECONNECT = re.compile(r"^Reconnecting\.\.\.\s*(\d+)\s*/\s*(\d+)")
_STATUS = re.compile(r"\b(401|403|429)\b")
#: "... or try again at Mar 10th, 2026 3:39 AM." (ChatGPT-plan usage limit wording)
_TRY_AGAIN = re.compile(
    r"try again at ([A-Z][a-z]{2} \d{1,2})(?:st|nd|rd|th)?, (\d{4}) (\d{1,2}:\d{2} [AP]M)"
)


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


@dataclass(frozen=True)
class _Raw:
    """Codex's own usage numbers (cached and cache-write are parts of input)."""

    input: int = 0
    cached: int = 0
    cache_write: int = 0
    output: int = 0

    @classmethod
    def of(cls, u: Any) -> _Raw:
        if not isinstance(u, dict):
            return cls()
        return cls(
            _int(u.get("input_tokens")),
            _int(u.get("cached_input_tokens")),
            _int(u.get("cache_write_input_tokens")),
            _int(u.get("output_tokens")),
        )

    def minus(self, o: _Raw) -> _Raw:
        return _Raw(
            max(0, self.input - o.input),
            max(0, self.cached - o.cached),
            max(0, self.cache_write - o.cache_write),
            max(0, self.output - o.output),
        )

    def plus(self, o: _Raw) -> _Raw:
        return _Raw(
            self.input + o.input,
            self.cached + o.cached,
            self.cache_write + o.cache_write,
            self.output + o.output,
        )

    def usage(self) -> Usage:
        return Usage(
            input_tokens=max(0, self.input - self.cached - self.cache_write),
            output_tokens=self.output,
            cache_read_tokens=self.cached,
            cache_creation_tokens=self.cache_write,
        )

    @property
    def total(self) -> int:
        return self.input + self.output


def parse_try_again(text: str) -> float | None:
    """The epoch of "try again at Mar 10th, 2026 3:39 AM" (local time), or None."""
    m = _TRY_AGAIN.search(text)
    if not m:
        return None
    try:
        dt = datetime.strptime(f"{m.group(1)} {m.group(2)} {m.group(3)}", "%b %d %Y %I:%M %p")
    except ValueError:
        return None
    return dt.timestamp()


def _window_name(minutes: Any) -> str | None:
    if not isinstance(minutes, int | float):
        return None
    return {300: "five_hour", 10080: "seven_day"}.get(int(minutes), f"{int(minutes)}m")


#: rollouts copied from the attempt this one resumes, with their sizes then (read from there on)
CARRIED_ROLLOUTS = "carried_rollouts.json"


def carried_offsets(attempt_dir: Path | None) -> dict[Path, int]:
    """Where to start reading each rollout carried over from a resumed session: its earlier
    turns were counted by the attempt that ran them."""
    if attempt_dir is None:
        return {}
    try:
        data = json.loads((attempt_dir / CARRIED_ROLLOUTS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {Path(k): v for k, v in data.items() if isinstance(v, int)}


class CodexNormalizer(BaseNormalizer):
    """Codex ``exec --json`` lines (and its rollout file, via poll) -> Events; classifies the end."""

    def __init__(
        self, task_id: str, attempt: int, start_seq: int = 0, attempt_dir: Path | None = None
    ) -> None:
        super().__init__(task_id, attempt, start_seq)
        self.attempt_dir = attempt_dir
        self.session_id: str | None = None
        self.context_window: int | None = None
        self.context_tokens: int | None = None
        self._counted = _Raw()
        self._open: dict[str, tuple[str, Any]] = {}  # item id -> (tool, input) of started items
        self._anon = 0
        self.turn_completed = False
        self.turn_failed: str | None = None
        self.last_error: str | None = None
        self.reconnects = 0
        self.error_info: Any = None  # rollout task_complete.error.codex_error_info
        self._offsets: dict[Path, int] = carried_offsets(attempt_dir)
        self._pending: list[Event] = []

    # -- stdout ----------------------------------------------------------------------------

    def feed(self, line: str, ts: float) -> list[Event]:
        obj = self.parse_json(line)
        if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
            return self.fallback(line, ts)
        try:
            return self._dispatch(obj, ts)
        except Exception:  # an unforeseen shape must not stop the event stream
            return [self.ev(ts, "text", text=line, raw=obj)]

    def _dispatch(self, obj: dict[str, Any], ts: float) -> list[Event]:
        t = obj["type"]
        if t == "thread.started":
            self.session_id = obj.get("thread_id") or self.session_id
            return [self.ev(ts, "session_started", session_id=self.session_id, raw=obj)]
        if t in ("item.started", "item.completed") and isinstance(obj.get("item"), dict):
            return self._item(obj["item"], t == "item.completed", ts)
        if t == "turn.completed":
            self.turn_completed = True
            out = self._usage_to(_Raw.of(obj.get("usage")), ts, force=True)
            self.result_text = self.last_text
            self.result_is_error = False
            out.append(self.ev(ts, "result", text=self.last_text, session_id=self.session_id, raw=obj))
            return out
        if t == "turn.failed":
            err = obj.get("error") if isinstance(obj.get("error"), dict) else {}
            assert isinstance(err, dict)
            msg = str(err.get("message") or "turn failed")
            self.turn_failed = msg
            self.result_text = msg
            self.result_is_error = True
            return [self.ev(ts, "result", text=msg, is_error=True, session_id=self.session_id, raw=obj)]
        if t == "error":
            msg = str(obj.get("message") or "")
            if _RECONNECT.match(msg):
                self.reconnects += 1
                return [self.ev(ts, "api_retry", text=msg, is_error=True, raw=obj)]
            self.last_error = msg
            return [self.ev(ts, "error", text=msg, is_error=True, raw=obj)]
        return []  # turn.started, item.updated, plan deltas...

    def _item_id(self, item: dict[str, Any], completed: bool) -> str:
        iid = item.get("id")
        if isinstance(iid, str) and iid:
            return iid
        # some builds omit ids (the auto-cancelled MCP call): pair by type/server/tool instead
        key = f"{item.get('type')}:{item.get('server', '')}:{item.get('tool', '')}"
        if completed:
            for k in self._open:
                if k.startswith(key + "#"):
                    return k
        self._anon += 1
        return f"{key}#{self._anon}"

    def _item(self, item: dict[str, Any], completed: bool, ts: float) -> list[Event]:
        it = item.get("type")
        if it == "agent_message":
            return [self.ev(ts, "text", text=str(item.get("text") or ""))] if completed else []
        if it in ("reasoning", "plan"):
            if not completed or not item.get("text"):
                return []
            return [self.ev(ts, "thinking" if it == "reasoning" else "text", text=str(item["text"]))]
        if it == "error":  # non-fatal warning (unknown model metadata...)
            return [self.ev(ts, "error", text=str(item.get("message") or ""), is_error=False, raw=item)]
        call = self._call_of(item)
        if call is None:
            return []  # todo_list and other progress items
        tool, tool_input = call
        iid = self._item_id(item, completed)
        out: list[Event] = []
        if not completed:
            self._open[iid] = call
            return [self.ev(ts, "tool_call", tool=tool, tool_input=tool_input, tool_id=iid)]
        if self._open.pop(iid, None) is None:  # completed without a started line (file_change)
            out.append(self.ev(ts, "tool_call", tool=tool, tool_input=tool_input, tool_id=iid))
        text, is_error = self._result_of(item)
        out.append(self.ev(ts, "tool_result", tool=tool, tool_id=iid, text=text, is_error=is_error))
        return out

    @staticmethod
    def _call_of(item: dict[str, Any]) -> tuple[str, Any] | None:
        it = item.get("type")
        if it == "command_execution":
            return "shell", {"command": item.get("command")}
        if it == "mcp_tool_call":
            return f"mcp__{item.get('server')}__{item.get('tool')}", item.get("arguments")
        if it == "file_change":
            return "file_change", {"changes": item.get("changes")}
        if it == "web_search":
            return "web_search", {"query": item.get("query")}
        if it == "collab_tool_call":
            return str(item.get("tool") or "collab"), {"prompt": item.get("prompt")}
        return None

    @staticmethod
    def _result_of(item: dict[str, Any]) -> tuple[str, bool]:
        it = item.get("type")
        status = item.get("status")
        failed = status in ("failed", "declined")
        if it == "command_execution":
            code = item.get("exit_code")
            return str(item.get("aggregated_output") or ""), failed or (isinstance(code, int) and code != 0)
        if it == "mcp_tool_call":
            err = item.get("error")
            if isinstance(err, dict) and err.get("message"):
                return str(err["message"]), True
            res = item.get("result")
            parts: list[str] = []
            if isinstance(res, dict):
                for b in res.get("content") or []:
                    if isinstance(b, dict) and isinstance(b.get("text"), str):
                        parts.append(b["text"])
                if not parts and res.get("structured_content") is not None:
                    parts.append(json.dumps(res["structured_content"]))
            return "\n".join(parts), failed
        if it == "file_change":
            changes = item.get("changes") or []
            lines = [f"{c.get('kind')} {c.get('path')}" for c in changes if isinstance(c, dict)]
            return "\n".join(lines), failed
        return str(item.get("query") or status or ""), failed

    def _usage_to(self, total: _Raw, ts: float, force: bool = False) -> list[Event]:
        """A usage event for what ``total`` (a cumulative count) adds to what was counted."""
        delta = total.minus(self._counted)
        if not delta.total and not force:
            return []
        if not delta.total and not (self.context_window or self.context_tokens):
            return []
        self._counted = self._counted.plus(delta)
        return [
            self.ev(
                ts,
                "usage",
                usage=delta.usage(),
                context_tokens=self.context_tokens,
                context_window=self.context_window,
            )
        ]

    # -- the rollout file ------------------------------------------------------------------

    def _rollouts(self) -> list[Path]:
        if self.attempt_dir is None:
            return []
        root = self.attempt_dir / "codex_home" / "sessions"
        if not root.is_dir():
            return []
        return sorted(root.glob("**/rollout-*.jsonl"))

    def _read_rollouts(self, ts: float) -> list[Event]:
        out: list[Event] = []
        for path in self._rollouts():
            off = self._offsets.get(path, 0)
            try:
                with path.open("rb") as f:
                    f.seek(off)
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n")
            if end < 0:
                continue
            self._offsets[path] = off + end + 1
            for raw in data[: end + 1].splitlines():
                try:
                    obj = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(obj, dict) and obj.get("type") == "event_msg":
                    payload = obj.get("payload")
                    if isinstance(payload, dict):
                        out += self._rollout_event(payload, ts)
        return out

    def _rollout_event(self, p: dict[str, Any], ts: float) -> list[Event]:
        pt = p.get("type")
        if pt == "task_started" and isinstance(p.get("model_context_window"), int):
            self.context_window = p["model_context_window"]
            return []
        if pt == "task_complete":
            err = p.get("error")
            if isinstance(err, dict):
                self.error_info = err.get("codex_error_info")
            return []
        if pt != "token_count":
            return []
        out: list[Event] = []
        info = p.get("info")
        if isinstance(info, dict):
            if isinstance(info.get("model_context_window"), int):
                self.context_window = info["model_context_window"]
            last = info.get("last_token_usage")
            if isinstance(last, dict):
                lt = last.get("total_tokens")
                self.context_tokens = lt if isinstance(lt, int) else _Raw.of(last).total
            out += self._usage_to(_Raw.of(info.get("total_token_usage")), ts)
        rl = self._rate_limit_of(p.get("rate_limits"), ts)
        if rl is not None:
            self.rate_limit = rl
            out.append(self.ev(ts, "rate_limit", rate_limit=rl, text=rl.status, raw=p.get("rate_limits")))
        return out

    @staticmethod
    def _rate_limit_of(rls: Any, ts: float) -> RateLimit | None:
        """The most constraining window of a rollout ``rate_limits`` object."""
        if not isinstance(rls, dict):
            return None
        best: RateLimit | None = None
        for key in ("primary", "secondary"):
            w = rls.get(key)
            if not isinstance(w, dict) or not isinstance(w.get("used_percent"), int | float):
                continue
            used = float(w["used_percent"]) / 100.0
            status = "rejected" if used >= 1.0 else "allowed_warning" if used >= 0.8 else "allowed"
            if rls.get("rate_limit_reached_type"):
                status = "rejected" if used >= 1.0 else status
            resets = w.get("resets_at")
            if not isinstance(resets, int | float) and isinstance(w.get("resets_in_seconds"), int | float):
                resets = ts + float(w["resets_in_seconds"])
            rl = RateLimit(
                account="codex",
                status=status,
                utilization=used,
                resets_at=float(resets) if isinstance(resets, int | float) else None,
                window=_window_name(w.get("window_minutes")),
                observed_at=ts,
            )
            if best is None or (rl.utilization or 0) > (best.utilization or 0):
                best = rl
        return best

    def poll(self, ts: float) -> list[Event]:
        out, self._pending = self._pending + self._read_rollouts(ts), []
        return out

    # -- classification --------------------------------------------------------------------

    @property
    def total_usage(self) -> Usage:
        """The sum of every usage event emitted so far."""
        return self._counted.usage()

    def _error_status(self) -> tuple[str | None, int | None]:
        """(kind, http status) from the rollout's structured ``codex_error_info``."""
        info = self.error_info
        if isinstance(info, str):
            return info, None
        if isinstance(info, dict) and info:
            kind, val = next(iter(info.items()))
            code = val.get("http_status_code") if isinstance(val, dict) else None
            return str(kind), code if isinstance(code, int) else None
        return None, None

    def outcome(self, exit_code: int | None) -> Outcome:
        # what the runner has not polled yet still informs the verdict (events kept for poll)
        self._pending += self._read_rollouts(time.time())
        common: dict[str, Any] = {"result_text": self.result_text, "cost_usd": None}
        if self.turn_completed and self.turn_failed is None:
            return Outcome("success", "", claimed_success=True, **common)
        msg = self.turn_failed or self.last_error or ""
        kind, status = self._error_status()
        if status is None:  # no rollout verdict: the stdout wording is all Codex offers
            m = _STATUS.search(msg)
            status = int(m.group(1)) if m else None
        rl = self.rate_limit
        resets = rl.resets_at if rl is not None and rl.status == "rejected" else None
        low = msg.lower()
        if kind == "context_window_exceeded" or "context window" in low:
            return Outcome("context_pressure", msg or "context window exceeded", **common)
        if msg.startswith("Quota exceeded"):  # insufficient_quota: billing, not a passing limit
            return Outcome("auth_failed", msg, **common)
        if status in (401, 403) or kind == "unauthorized":
            return Outcome("auth_failed", msg or f"authentication failed ({status})", **common)
        limited = (
            status == 429
            or kind == "usage_limit_exceeded"
            or "usage limit" in low
            or (self.rate_limit is not None and self.rate_limit.status == "rejected")
        )
        if limited:
            return Outcome(
                "rate_limited", msg or "rate limited", resets_at=resets or parse_try_again(msg), **common
            )
        if msg:
            return Outcome("failure", msg, **common)
        if exit_code is None:
            return Outcome("failure", "ended without turn.completed", **common)
        return Outcome("failure", f"exited {exit_code} without turn.completed", **common)


class CodexCoder(BaseCoder):
    """Builds the ``codex exec --json`` command line and its per-run CODEX_HOME.

    Codex reads its whole configuration from ``$CODEX_HOME/config.toml``; the run's own
    CODEX_HOME (so Codex's sessions and logs stay in the attempt directory) gets a private copy
    (0600) of the user's config.toml with everything in it kept (providers, default model,
    profiles, project trust, the user's ``mcp_servers``) and fleet's ``ask_human`` server added;
    the login (auth.json) is copied likewise, and AGENTS.md, prompts, skills and rules are linked.
    With ``mcp = "fleet-only"`` the user's servers are left out.
    """

    name: ClassVar[str] = "codex"
    program: ClassVar[str | None] = "codex"
    install_hint: ClassVar[str] = "npm install -g @openai/codex"
    #: nothing: the run has its own CODEX_HOME (the user's ~/.codex is only read)
    sandbox_state: ClassVar[tuple[str, ...]] = ()

    @staticmethod
    def codex_home(ctx: AttemptContext) -> Path:
        return ctx.attempt_dir / "codex_home"

    def argv(self, ctx: AttemptContext) -> list[str]:
        # -C sets the agent's root; the sandbox is off because the fleet's worktree is the fence
        # (Codex's landlock/seccomp sandbox also fails in many containers) and exec never asks.
        args = [
            self.program or "codex",
            "exec",
            "--json",
            "-C",
            str(ctx.workdir),
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
        ]
        if ctx.model:
            args += ["-m", ctx.model]
        args.append("-")  # the prompt comes on stdin: no ARG_MAX limit
        return args

    def env(self, ctx: AttemptContext) -> dict[str, str]:
        return {"CODEX_HOME": str(self.codex_home(ctx))}

    @staticmethod
    def prompt_file(ctx: AttemptContext) -> Path:
        return ctx.attempt_dir / "codex_prompt.md"

    def stdin(self, ctx: AttemptContext) -> bytes | None:
        if len(ctx.prompt) <= MAX_INPUT_CHARS:
            return ctx.prompt.encode("utf-8")
        # Codex refuses a longer input ("input_too_large"): the prompt goes whole into a file
        return (
            f"Your task's instructions are {len(ctx.prompt)} characters long, more than Codex accepts "
            f"as input, so they are in the file {self.prompt_file(ctx)}. Read that whole file first "
            "(in parts if needed), then do exactly what it says.\n"
        ).encode()

    @staticmethod
    def user_home() -> Path:
        """The user's own CODEX_HOME (read only: config and login are copied from it)."""
        return Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex")

    def user_config(self) -> tomlkit.TOMLDocument | None:
        import tomlkit  # only a codex attempt needs it: not imported at every start

        text = read_text(self.user_home() / "config.toml")
        if text is None:
            return None
        try:
            return tomlkit.parse(text)
        except Exception:  # an unreadable user config must not block the run (Codex will say why)
            return None

    def config(self, ctx: AttemptContext) -> tomlkit.TOMLDocument:
        """The per-run config.toml: the user's whole config plus fleet's ask_human server."""
        import tomlkit

        doc = self.user_config() or tomlkit.document()
        if not ctx.user_mcp:
            doc.pop("mcp_servers", None)
        note = f"fleet-tui: task {ctx.task.id} attempt {ctx.attempt}; CODEX_HOME points here"
        doc.add(tomlkit.comment(note))
        if ctx.mcp_command:
            server = tomlkit.table()
            server["command"] = ctx.mcp_command[0]
            server["args"] = list(ctx.mcp_command[1:])
            env = tomlkit.inline_table()
            env.update(dict(ctx.mcp_env))
            server["env"] = env
            server["startup_timeout_sec"] = 30
            server["tool_timeout_sec"] = MCP_TOOL_TIMEOUT_SEC
            # exec has nobody to approve a call: approve ask_human up front
            server["default_tools_approval_mode"] = "approve"
            tool = tomlkit.table()
            tool["approval_mode"] = "approve"
            tools = tomlkit.table()
            tools["ask_human"] = tool
            server["tools"] = tools
            servers = doc.get("mcp_servers")
            if not isinstance(servers, dict):
                servers = tomlkit.table()
                doc["mcp_servers"] = servers
            servers["ask_human"] = server
        return doc

    def prepare(self, ctx: AttemptContext) -> None:
        home = self.codex_home(ctx)
        home.mkdir(parents=True, exist_ok=True)
        if len(ctx.prompt) > MAX_INPUT_CHARS:
            write_private(self.prompt_file(ctx), ctx.prompt)
        import tomlkit

        write_private(home / "config.toml", tomlkit.dumps(self.config(ctx)))
        user = self.user_home()
        auth = read_text(user / "auth.json")
        if auth is not None:
            write_private(home / "auth.json", auth)
        link_user_files(user, home, _LINKED_USER_FILES)

    def setup(self, user_mcp: bool = True) -> Setup:
        cfg_path = self.user_home() / "config.toml"
        doc = self.user_config()
        files = (str(cfg_path),) if cfg_path.is_file() else ()
        servers: list[str] = []
        model: str | None = None
        if doc is not None:
            if user_mcp and isinstance(doc.get("mcp_servers"), dict):
                servers = sorted(str(k) for k in doc["mcp_servers"])
            m = doc.get("model")
            model = str(m) if m else None
            provider = doc.get("model_provider")
            if model and provider:
                model = f"{model} (provider {provider})"
        notes = () if user_mcp else ("mcp = fleet-only: the user's MCP servers are off",)
        return Setup(files, (*servers, "ask_human"), model or "Codex's default", notes)

    can_resume: ClassVar[bool] = True

    def resume_argv(self, ctx: AttemptContext, session_id: str, previous: Path) -> list[str]:
        """``codex exec resume <id> -``: the session's rollout is copied from the previous run's
        CODEX_HOME into this one's (exec resume has no -C: the agent runs in the workdir)."""
        old = previous / "codex_home" / "sessions"
        found = sorted(old.glob(f"**/rollout-*{session_id}.jsonl")) if old.is_dir() else []
        if not found:
            raise CannotResume(f"codex session {session_id} not found (its rollout is gone)")
        carried: dict[str, int] = {}
        for f in found:
            dst = self.codex_home(ctx) / "sessions" / f.relative_to(old)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dst)
            carried[str(dst)] = dst.stat().st_size
        (ctx.attempt_dir / CARRIED_ROLLOUTS).write_text(json.dumps(carried), encoding="utf-8")
        args = [self.program or "codex", "exec", "resume", "--json", "--skip-git-repo-check"]
        args.append("--dangerously-bypass-approvals-and-sandbox")
        if ctx.model:
            args += ["-m", ctx.model]
        return [*args, session_id, "-"]

    def interactive_argv(self, session_id: str | None, attempt_dir: Path) -> tuple[list[str], dict[str, str]]:
        """``codex resume <id>`` with the run's own CODEX_HOME (its config and the rollout)."""
        if not session_id:
            raise CannotResume("no codex session id was recorded for this task")
        return [self.program or "codex", "resume", session_id], {
            "CODEX_HOME": str(attempt_dir / "codex_home")
        }

    def normalizer(
        self, task_id: str, attempt: int, start_seq: int = 0, attempt_dir: Path | None = None
    ) -> CodexNormalizer:
        return CodexNormalizer(task_id, attempt, start_seq, attempt_dir)
