"""The Coder protocol: how a task becomes a command, and how its output becomes Events.

A coder is the only place that knows a vendor's flags and output format. The engine knows only
this protocol, so adding an agent CLI is one module (and an entry point in the
``fleet_tui.coders`` group for third parties). No textual or rich imports here.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from fleet_tui.scheduler.model import Event, Outcome, RateLimit, Task
from fleet_tui.trust import read_capped


@dataclass(frozen=True)
class AttemptContext:
    """Everything a coder may use to build one attempt's command line and configuration."""

    task: Task
    attempt: int
    prompt: str
    workdir: Path  # where the agent runs (its worktree, or the task's cwd)
    attempt_dir: Path  # tasks/<id>/attempts/<n>/: per-run config goes here, never in ~
    home: Path  # the fleet home
    model: str | None = None
    #: argv that starts the ask_human stdio MCP server for this attempt
    mcp_command: tuple[str, ...] = ()
    #: environment the MCP server needs (FLEET_HOME, FLEET_TASK_ID, FLEET_ATTEMPT, store URL...)
    mcp_env: Mapping[str, str] = field(default_factory=dict)
    #: the agent also sees the user's own MCP servers (config ``mcp = "inherit"``); False:
    #: only fleet's ask_human (``mcp = "fleet-only"``)
    user_mcp: bool = True


class Normalizer(Protocol):
    """Per-attempt, stateful: turns raw output lines into Events and classifies the end."""

    def feed(self, line: str, ts: float) -> list[Event]:
        """One raw stdout line (without its newline) -> zero or more Events.

        Must never raise on bad input: a line that is not what the coder expects becomes a
        ``text`` (or ``stderr``) event carrying the line.
        """
        ...

    def outcome(self, exit_code: int | None) -> Outcome:
        """The attempt's classified outcome from what was fed so far and the exit code."""
        ...

    def poll(self, ts: float) -> list[Event]:
        """Events from side files (e.g. Codex's rollout in the run's own CODEX_HOME); called by
        the runner on every tail tick and once at the end. Most coders return []."""
        ...


class Coder(Protocol):
    name: ClassVar[str]
    #: the executable this coder needs on PATH (None: nothing external)
    program: ClassVar[str | None]
    #: how to install ``program``, for doctor/validate/never_started messages
    install_hint: ClassVar[str]

    def argv(self, ctx: AttemptContext) -> list[str]: ...

    def env(self, ctx: AttemptContext) -> dict[str, str]:
        """Extra environment for the agent (merged over the supervisor's)."""
        ...

    def stdin(self, ctx: AttemptContext) -> bytes | None:
        """Bytes to write to the agent's stdin (then closed); None: stdin is /dev/null."""
        ...

    def prepare(self, ctx: AttemptContext) -> None:
        """Write per-run config (MCP registration, settings) under ``ctx.attempt_dir``."""
        ...

    def normalizer(
        self, task_id: str, attempt: int, start_seq: int = 0, attempt_dir: Path | None = None
    ) -> Normalizer:
        """A fresh normalizer; ``attempt_dir`` lets it read side files the coder wrote there."""
        ...

    def available(self) -> tuple[bool, str]:
        """(usable, detail): found on PATH and runnable, or why not (with the install hint)."""
        ...

    def version(self) -> str | None: ...

    def setup(self, user_mcp: bool = True) -> Setup:
        """The user's configuration the agent will run with (config files, MCP servers, model)."""
        ...


_DECODER = json.JSONDecoder()

#: most characters an event keeps of a text, a tool's input or its raw vendor object; the whole
#: line stays in the attempt's stdout.jsonl (``fleet-tui logs --raw``)
EVENT_FIELD_CAP = 256 * 1024


def _size_over(value: Any, budget: int) -> int:
    """What is left of ``budget`` after ``value``'s rough JSON size; stops early below 0, so a
    30 MB structure costs no more than the cap to measure."""
    stack = [value]
    while stack and budget >= 0:
        v = stack.pop()
        if isinstance(v, str):
            budget -= len(v) + 2
        elif isinstance(v, dict):
            budget -= 2
            for k, x in v.items():
                budget -= len(str(k)) + 4
                stack.append(x)
        elif isinstance(v, list | tuple):
            budget -= 2
            stack.extend(v)
        else:
            budget -= 8
    return budget


#: the largest user config file a coder reads to build its per-run layer
MAX_USER_CONFIG_BYTES = 4 * 1024 * 1024


def read_user_config(path: Path) -> str:
    """A user's CLI config file as text, read with a cap: a path to /dev/zero, a FIFO or a huge
    file raises ValueError (TrustError) instead of hanging or filling the engine's memory
    (callers then run without the user's layer, as for an unreadable file)."""
    return read_capped(path, MAX_USER_CONFIG_BYTES, "config").decode("utf-8")


def cap_text(text: str, cap: int = EVENT_FIELD_CAP) -> str:
    if len(text) <= cap:
        return text
    return text[:cap] + f"\n[... {len(text) - cap} more characters in stdout.jsonl]"


def cap_value(value: Any, cap: int = EVENT_FIELD_CAP) -> Any:
    """``value`` when its JSON is at most ``cap`` characters, else a string with its first
    ``cap`` characters and how much was cut (the whole value stays in stdout.jsonl)."""
    if value is None or isinstance(value, int | float | bool) or _size_over(value, cap) >= 0:
        return value
    text = json.dumps(value, ensure_ascii=False, default=str)
    return cap_text(text, cap)


class BaseNormalizer:
    """Shared plumbing: sequence numbers and safe fallbacks for lines a coder cannot parse."""

    def __init__(self, task_id: str, attempt: int, start_seq: int = 0) -> None:
        self.task_id = task_id
        self.attempt = attempt
        self.seq = start_seq
        self.last_text: str | None = None
        self.result_text: str | None = None
        self.result_is_error: bool | None = None
        self.cost_usd: float | None = None
        self.rate_limit: RateLimit | None = None
        #: the last line's JSON value when that line was short enough that the value cannot be
        #: over ``EVENT_FIELD_CAP`` (``parse_json``): ``ev`` then keeps it as ``raw`` unmeasured
        self._small: Any = None
        self._small_text: str | None = None  # that line, stripped: the value's JSON

    def ev(self, ts: float, kind: str, **kw: Any) -> Event:
        # an event is stored and sent to every viewer: a huge tool input or result is kept whole
        # in stdout.jsonl only
        if isinstance(kw.get("text"), str):
            kw["text"] = cap_text(kw["text"])
        if kw.get("tool_input") is not None:
            kw["tool_input"] = cap_value(kw["tool_input"])
        raw = kw.get("raw")
        if raw is not None and raw is self._small:
            kw["raw_json"] = self._small_text  # the line itself: nothing to measure or encode
        elif raw is not None and _size_over(raw, EVENT_FIELD_CAP) < 0:
            kw["raw"] = None
        e = Event.new(self.task_id, self.attempt, self.seq, ts, kind, **kw)
        self.seq += 1
        if kind == "text" and kw.get("text"):
            self.last_text = kw["text"]
        return e

    def parse_json(self, line: str) -> Any:
        """The parsed JSON value of a line, or None when the line is not JSON."""
        s = line.strip()
        if not s or s[0] not in "{[":
            return None
        try:  # raw_decode skips json.loads' two whitespace regex passes (we stripped already)
            value, end = _DECODER.raw_decode(s)
        except (ValueError, RecursionError):
            return None
        if end != len(s):
            return None
        # ``_size_over`` counts at most 4 characters per character of the JSON text (a one-digit
        # number counts 8 for its 2 characters with the comma): a line under a quarter of the
        # cap holds a value under it, whose walk was 60 % of the normalizers' time
        small = len(s) * 4 < EVENT_FIELD_CAP
        self._small, self._small_text = (value, s) if small else (None, None)
        return value

    def poll(self, ts: float) -> list[Event]:
        return []

    def fallback(self, line: str, ts: float) -> list[Event]:
        if not line.strip():
            return []
        return [self.ev(ts, "text", text=line)]


class CannotResume(Exception):
    """Why a coder cannot continue a recorded session (the attempt then starts a fresh one)."""


class BaseCoder:
    """Defaults for the optional parts of the protocol."""

    name: ClassVar[str] = "base"
    program: ClassVar[str | None] = None
    install_hint: ClassVar[str] = ""
    #: each model is its own rate-limit account (the simulated agent uses it to show one account
    #: limited while another keeps running); real CLIs share one account per coder
    per_model_accounts: ClassVar[bool] = False
    #: what the CLI itself writes under HOME (folders or files, ``~/``-relative), kept writable
    #: when they exist and the task runs in a sandbox (the rest of HOME is read-only)
    sandbox_state: ClassVar[tuple[str, ...]] = ()

    #: whether this CLI can continue a session recorded by an earlier attempt (see resume_argv)
    can_resume: ClassVar[bool] = False
    #: how a follow-up (``fleet-tui send``) reaches the running agent: ``"turn"`` — it is stopped
    #: at its next turn boundary (a tool result that closes every open call, or its final
    #: result; humans/followup.py); ``"now"`` — it has no turns to wait for and is stopped at once
    followup_stop: ClassVar[str] = "turn"

    def resume_argv(self, ctx: AttemptContext, session_id: str, previous: Path) -> list[str]:
        """The command line that continues ``session_id`` (recorded by the attempt whose
        directory is ``previous``) with ``ctx.prompt`` as its next turn. Called after
        ``prepare``; carries the session's files into this attempt's per-run config when the CLI
        keeps them there. Raises CannotResume saying why not."""
        raise CannotResume(f"{self.name} cannot continue a session")

    def interactive_argv(self, session_id: str | None, attempt_dir: Path) -> tuple[list[str], dict[str, str]]:
        """The command and extra environment that open this CLI's own interactive session on
        ``session_id`` (recorded by the attempt in ``attempt_dir``), for a person taking over a
        task (``fleet-tui takeover``). Raises CannotResume saying why not."""
        raise CannotResume(f"the {self.name} coder has no interactive session to open")

    def env(self, ctx: AttemptContext) -> dict[str, str]:
        return {}

    def stdin(self, ctx: AttemptContext) -> bytes | None:
        return None

    def prepare(self, ctx: AttemptContext) -> None:
        return None

    def which(self) -> str | None:
        return shutil.which(self.program) if self.program else None

    def available(self) -> tuple[bool, str]:
        if self.program is None:
            return True, "built in"
        path = self.which()
        if path is None:
            return False, f"'{self.program}' not found on PATH; install it: {self.install_hint}"
        return True, path

    def setup(self, user_mcp: bool = True) -> Setup:
        """The user's configuration this coder's agent runs with (for ``doctor``)."""
        return Setup(mcp_servers=("ask_human",))

    def version(self) -> str | None:
        path = self.which()
        if path is None:
            return None
        try:
            out = subprocess.run(
                [path, "--version"], capture_output=True, text=True, timeout=20, env=os.environ.copy()
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        text = (out.stdout or out.stderr).strip().splitlines()
        return text[0] if text else None


def write_private(path: Path, text: str) -> None:
    """Write a per-run file readable by this user only (0600): it may hold a copy of the user's
    config (tokens, provider keys) or the store's connection settings."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)


def link_user_files(src_dir: Path, dst_dir: Path, names: tuple[str, ...]) -> None:
    """Symlink the user's ``names`` from ``src_dir`` into a per-run config dir (never copied, so
    nothing of the user's is duplicated or diverges; missing ones are skipped)."""
    if not src_dir.is_dir() or src_dir.resolve() == dst_dir.resolve():
        return
    for name in names:
        src, dst = src_dir / name, dst_dir / name
        if (src.exists() or src.is_symlink()) and not (dst.exists() or dst.is_symlink()):
            try:
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.symlink_to(src)
            except OSError:
                pass


def read_text(path: Path) -> str | None:
    """A user config file's text (read with ``read_user_config``'s cap), or None when it is
    missing, unreadable, not a regular file or too big: the run then goes on without it."""
    try:
        return read_user_config(path)
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class Setup:
    """What ``fleet-tui doctor`` shows of one coder: the user's config the agent will run with."""

    config_files: tuple[str, ...] = ()  # the user's config files that were found
    mcp_servers: tuple[str, ...] = ()  # MCP servers the agent will see (ask_human included)
    model: str | None = None  # the model it will use when a task names none
    notes: tuple[str, ...] = ()


def setup_lines(coder: Coder, user_mcp: bool, default_model: str | None) -> list[str]:
    """What ``fleet-tui doctor`` prints of a coder's user setup (config files, model, MCP servers)."""
    try:
        setup = coder.setup(user_mcp)
    except Exception as e:  # a user config we cannot read must not hide the other coders
        return [f"could not read its user config: {e}"]
    return [
        f"config: {', '.join(setup.config_files) or 'no user config file found'}",
        f"model: {default_model or setup.model or '?'}" + (" (fleet default_model)" if default_model else ""),
        f"MCP servers: {', '.join(setup.mcp_servers)}",
        *setup.notes,
    ]


class CoderNotFound(LookupError):
    pass


#: the coders that ship with fleet-tui (declared as entry points too, for tools that list the
#: group): found without reading every installed package's metadata, which cost ~13 ms of
#: imports and ~7 ms of reading at every start, each imported when first used. A third-party
#: coder under one of these names is not used: a built-in name always means the built-in coder.
BUILTIN: dict[str, tuple[str, str]] = {
    "shell": ("fleet_tui.coders.shell", "ShellCoder"),
    "sim": ("fleet_tui.coders.sim", "SimCoder"),
    "claude": ("fleet_tui.coders.claude", "ClaudeCoder"),
    "codex": ("fleet_tui.coders.codex", "CodexCoder"),
    "opencode": ("fleet_tui.coders.opencode", "OpenCodeCoder"),
    "gemini": ("fleet_tui.coders.gemini", "GeminiCoder"),
}

_PLUGINS: dict[str, type] | None = None


def _plugins() -> dict[str, type]:
    """Third-party coders (the ``fleet_tui.coders`` entry points under other names), read once,
    only when a name that is not built in is asked for or the names are listed."""
    global _PLUGINS
    if _PLUGINS is None:
        from importlib.metadata import entry_points

        reg: dict[str, type] = {}
        for ep in entry_points(group="fleet_tui.coders"):
            if ep.name in BUILTIN:
                continue
            try:
                reg[ep.name] = ep.load()
            except Exception:  # a broken third-party plugin must not break the fleet
                continue
        _PLUGINS = reg
    return _PLUGINS


def coder_class(name: str) -> type | None:
    """The class registered as coder ``name`` (None: there is none); a built-in one's module is
    imported on first use (and found in ``sys.modules`` after that)."""
    if name in BUILTIN:
        module, attr = BUILTIN[name]
        cls: type = getattr(importlib.import_module(module), attr)
        return cls
    return _plugins().get(name)


def account_of(coder_name: str, model: str | None) -> str:
    """The rate-limit account a task's attempts count against."""
    cls = coder_class(coder_name)
    if cls is not None and getattr(cls, "per_model_accounts", False) and model:
        return f"{coder_name}:{model}"
    return coder_name


def coder_names() -> list[str]:
    return sorted({*BUILTIN, *_plugins()})


def get_coder(name: str) -> Coder:
    """An instance of coder ``name``: a built-in one, or one registered in the entry-point group."""
    cls = coder_class(name)
    if cls is None:
        known = ", ".join(coder_names()) or "none"
        raise CoderNotFound(f"unknown coder {name!r} (known: {known})")
    inst: Coder = cls()
    return inst
