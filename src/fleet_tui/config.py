"""Runtime configuration: ``<home>/config.toml`` loaded, validated, hot-reloaded and edited.

The engine runs for hours and the user tunes it while it runs (``fleet-tui config set
max_concurrent 8``, or an editor), so this module gives three things: a strict loader (an
unknown or mistyped key is an error naming the key, a did-you-mean and the file:line — a typo
must never be silently ignored), an editor that writes through tomlkit so the user's comments and
layout survive, and a watcher the engine polls about once a second that hands over a new Config
when the file changed, or an error while an edit is broken (the last good Config stays in force).

The file is flat: every key sits at the top level and is addressed by that same name in
``config get/set`` (``max_concurrent``, not ``limits.max_concurrent``). A flat file has one
obvious place for each key, needs no section knowledge on the command line, and its grouping is
done with comments in the default file. A key that is absent takes the built-in default; an
optional key (shown as ``none``) is unset by ``config set KEY none``.
"""

from __future__ import annotations

import math
import os
import tempfile
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from fleet_tui.taskfile import did_you_mean, toml_key_lines
from fleet_tui.trust import TrustError, check_trusted, read_capped

__all__ = [
    "KEYS",
    "Config",
    "ConfigError",
    "ConfigWatcher",
    "config_path",
    "get_value",
    "load_config",
    "load_config_lenient",
    "parse_value",
    "set_value",
    "write_default",
]

MIB = 1024 * 1024
#: the largest config file read (a real one is a few KiB; a path to /dev/zero must not eat memory)
MAX_CONFIG_BYTES = 1 * MIB

#: kinds of notification (notify_events, and the per-URL prefix of notify entries)
NOTIFY_KINDS = ("question", "needs_human", "done", "drained", "rate_limit", "error")


@dataclass(frozen=True)
class Config:
    """The engine's tunables. Field name == config-file key (the file is flat)."""

    max_concurrent: int = 4
    default_coder: str = "claude"
    default_model: str | None = None
    max_retries: int = 2
    rate_limit_threshold: float = 0.9
    max_load_per_core: float = 2.0
    mem_floor_gib: float = 2.0
    disk_floor_gib: float = 1.0
    stall_min: float = 10.0
    timeout_min: float = 60.0
    lease_s: float = 30.0
    heartbeat_s: float = 5.0
    kill_grace_s: float = 5.0
    agent_nice: int = 5
    leave_running_h: float = 12.0
    max_line_bytes: int = 64 * MIB
    context_handoff_share: float = 0.85
    max_handoffs: int = 3
    budget_usd_daily: float | None = None
    retry_backoff_s: tuple[float, ...] = (30.0, 120.0, 480.0)
    question_timeout_min: float = 60.0
    mcp: Literal["inherit", "fleet-only"] = "inherit"
    on_quit: Literal["ask", "leave", "stop"] = "ask"
    store: str | None = None
    host_tags: tuple[str, ...] = ()
    worktree_setup: str | None = None
    keep_worktrees: bool = False
    sandbox: Literal["none", "bwrap"] = "none"
    github_poll_s: float = 60.0
    notify: tuple[str, ...] = ()
    notify_events: tuple[str, ...] = ("question", "needs_human", "drained", "rate_limit", "error")
    notify_desktop: Literal["auto", "on", "off"] = "auto"
    notify_terminal: Literal["osc9", "osc777", "bell", "off"] = "osc9"
    notify_timeout_s: float = 10.0
    telegram_token: str | None = None
    telegram_chat: str | None = None
    telegram_api: str = "https://api.telegram.org"
    loop_same_call: int = 6
    loop_output_tokens: int = 100_000
    loop_same_question: bool = True
    continue_session: Literal["auto", "fresh"] = "auto"
    followup_grace_s: float = 60.0

    @property
    def stale_s(self) -> float:
        """How long after its last heartbeat an engine (or its host) no longer counts as live."""
        return max(3 * self.heartbeat_s, 5.0)


class ConfigError(ValueError):
    """A config file or value that cannot be used; the message says where and how to fix it."""


@dataclass(frozen=True)
class _Key:
    """One config.toml key: its type, its documentation and its bounds."""

    kind: Literal["int", "float", "str", "bool", "floats", "strs"]
    doc: str
    optional: bool = False
    low: float | None = None  # inclusive lower bound
    high: float | None = None  # inclusive upper bound
    above: float | None = None  # exclusive lower bound
    choices: tuple[str, ...] = ()
    example: str | None = None  # shown in the default file for keys that are unset by default
    split: bool = True  # strs: ``config set`` splits a plain value on commas (URLs may hold commas)


#: Every key, in the order and groups of the default file. Group headings start with "##".
KEYS: dict[str, _Key] = {
    "max_concurrent": _Key("int", "agents running at once on this machine", low=1),
    "default_coder": _Key("str", "coder for tasks that name none (claude, codex, opencode, gemini, sim...)"),
    "default_model": _Key(
        "str", "model for tasks that name none; unset: the coder's own default", True, example='"sonnet"'
    ),
    "rate_limit_threshold": _Key(
        "float",
        "hold new starts when a coder account's utilisation is at or above this share (0..1)",
        above=0,
        high=1,
    ),
    "max_load_per_core": _Key(
        "float", "hold new starts while the load average per core is above this", above=0
    ),
    "mem_floor_gib": _Key("float", "keep this much memory free (GiB) on top of one agent's usage", low=0),
    "disk_floor_gib": _Key("float", "keep this much disk free (GiB) in the fleet home", low=0),
    "budget_usd_daily": _Key(
        "float",
        "stop starting attempts once today's spend reaches this (USD); unset: no budget",
        True,
        above=0,
        example="20",
    ),
    "max_retries": _Key("int", "retries after a failed attempt or verifier, then needs_human", low=0),
    "retry_backoff_s": _Key("floats", "wait before retry 1, 2, 3...; the last value repeats", low=0),
    "stall_min": _Key("float", "stop an attempt after this many minutes without output", above=0),
    "timeout_min": _Key("float", "wall-clock cap of one attempt, minutes", above=0),
    "context_handoff_share": _Key(
        "float", "hand a task to a fresh session when its context is this full (0..1)", above=0, high=1
    ),
    "max_handoffs": _Key("int", "context handoffs per task before needs_human", low=0),
    "max_line_bytes": _Key(
        "int",
        "longest agent output line kept whole; longer ones are cut and recorded as 'oversized'",
        low=1024,
    ),
    "lease_s": _Key("float", "a claim's lease; another engine may reclaim a task after it expires", above=0),
    "heartbeat_s": _Key("float", "how often an engine renews its leases and host row (< lease_s)", above=0),
    "kill_grace_s": _Key("float", "seconds between SIGTERM and SIGKILL when stopping an agent", low=0),
    "agent_nice": _Key(
        "int",
        "scheduling niceness of agents, their verifiers and setup commands (0-19): a busy fleet "
        "leaves the cockpit responsive",
        low=0,
        high=19,
    ),
    "leave_running_h": _Key(
        "float", "hours agents left running on quit may go on without a supervisor adopting them", above=0
    ),
    "on_quit": _Key(
        "str",
        "closing the cockpit with agents running: ask, leave (keep running, adopt later) or stop",
        choices=("ask", "leave", "stop"),
    ),
    "store": _Key(
        "str",
        "store URL; unset: the embedded SQLite fleet.db in the home",
        True,
        example='"postgresql://fleet@db.example/fleet"',
    ),
    "question_timeout_min": _Key(
        "float",
        "an unanswered question is answered 'no answer; proceed or stop' after this many minutes",
        above=0,
    ),
    "mcp": _Key(
        "str",
        "MCP servers agents see: inherit (the user's own, from each CLI's config, plus ask_human) "
        "or fleet-only (ask_human only)",
        choices=("inherit", "fleet-only"),
    ),
    "host_tags": _Key("strs", "tags of this machine, matched against a task's requires"),
    "worktree_setup": _Key(
        "str", "command run in each new worktree before its agent starts", True, example='"uv sync"'
    ),
    "keep_worktrees": _Key("bool", "keep worktrees of finished tasks instead of removing clean ones"),
    "sandbox": _Key(
        "str",
        "run agents, verifiers and reviewers in a sandbox: bwrap (Linux bubblewrap) or none; a task's "
        "own sandbox key wins (see README, Sandbox)",
        choices=("none", "bwrap"),
    ),
    "github_poll_s": _Key(
        "float", 'seconds between looks at the GitHub state of open pull requests (merge = "pr")', low=1
    ),
    "notify": _Key(
        "strs",
        "where notifications go: apprise URLs (ntfys://topic, tgram://bot/chat, json://host/path...);"
        ' a leading "question,needs_human " limits one URL to those kinds',
        split=False,
    ),
    "notify_events": _Key(
        "strs",
        "kinds of notification sent: question, needs_human, done, drained, rate_limit, error"
        " (done: every task; a task's own notify_done = true adds just that one)",
        choices=NOTIFY_KINDS,
    ),
    "notify_desktop": _Key(
        "str",
        "desktop notifications (D-Bus, macOS): auto = when a desktop session exists",
        choices=("auto", "on", "off"),
    ),
    "notify_terminal": _Key(
        "str",
        "notifications in the engine's terminal (the cockpit's, or run's): a bell plus an OSC 9"
        " (iTerm2, WezTerm, Ghostty, Windows Terminal) or OSC 777 (VTE, foot) pop-up, a bell only, or off",
        choices=("osc9", "osc777", "bell", "off"),
    ),
    "notify_timeout_s": _Key("float", "give up sending one notification to one target after this", above=0),
    "telegram_token": _Key(
        "str",
        "a Telegram bot's token (from @BotFather): notifications go to telegram_chat, questions are"
        " answered from there",
        True,
        example='"123456789:AA..."',
    ),
    "telegram_chat": _Key(
        "str",
        "the Telegram chat id the bot writes to; only this chat may answer",
        True,
        example='"123456789"',
    ),
    "telegram_api": _Key("str", "the Telegram Bot API base URL (a self-hosted Bot API server)"),
    "loop_same_call": _Key(
        "int", "park a task whose agent makes the same tool call this many times in a row (0: off)", low=0
    ),
    "loop_output_tokens": _Key(
        "int", "park a task whose agent spends this many output tokens without new output (0: off)", low=0
    ),
    "loop_same_question": _Key("bool", "park a task whose agent asks again a question already answered"),
    "continue_session": _Key(
        "str",
        "auto: a retry, a follow-up or a crash-resume continues the agent's own session when its CLI "
        "can; fresh: always a new session (a task's own continue key wins)",
        choices=("auto", "fresh"),
    ),
    "followup_grace_s": _Key(
        "float",
        "how long a follow-up waits for a running agent's next turn boundary before stopping it",
        low=0,
    ),
}


_GROUPS: dict[str, str] = {
    "max_concurrent": "Admission: what may start, and when",
    "max_retries": "Attempts: limits, retries and context handoffs",
    "lease_s": "Processes, leases and the store",
    "question_timeout_min": "Questions, placement and worktrees",
    "notify": "Notifications, and agents stuck in a loop",
}

assert set(KEYS) == {f.name for f in fields(Config)}, "KEYS and Config must list the same keys"


def config_path(home: Path) -> Path:
    """Where a fleet home keeps its config."""
    return Path(home) / "config.toml"


# --------------------------------------------------------------------------------------------
# Values


def _describe(key: str) -> str:
    spec = KEYS[key]
    kind = {"int": "a whole number", "float": "a number", "str": "a string", "bool": "true or false",
            "floats": "an array of numbers", "strs": "an array of strings"}[spec.kind]  # fmt: skip
    if spec.choices:
        kind = " or ".join(repr(c) for c in spec.choices)
    return kind


def _check(key: str, value: Any) -> Any:
    """Validate one TOML value for ``key``; returns it converted to the field's type."""
    spec = KEYS[key]
    bad = ConfigError(f"{key} must be {_describe(key)}, got {value!r}")
    if spec.kind == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            raise bad
    elif spec.kind == "float":
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise bad
        value = float(value)
    elif spec.kind == "str":
        if not isinstance(value, str):
            raise bad
        if spec.choices and value not in spec.choices:
            raise ConfigError(
                f"{key} must be {_describe(key)}, got {value!r}{did_you_mean(value, spec.choices)}"
            )
        if not value.strip():
            raise ConfigError(
                f"{key} must not be empty" + (" (use none to unset it)" if spec.optional else "")
            )
        if key == "store":  # a typo must be refused here, not replaced by the home's fleet.db later
            from fleet_tui.scheduler.store.protocol import StoreError, check_store_url

            try:
                check_store_url(value)
            except StoreError as exc:
                raise ConfigError(f"{key}: {exc}") from None
    elif spec.kind == "bool":
        if not isinstance(value, bool):
            raise bad
    elif spec.kind == "floats":
        if (
            not isinstance(value, list | tuple)
            or not value
            or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in value)
        ):
            raise ConfigError(
                f"{key} must be a non-empty array of numbers like [30, 120, 480], got {value!r}"
            )
        value = tuple(float(x) for x in value)
    elif spec.kind == "strs":
        if not isinstance(value, list | tuple) or not all(isinstance(x, str) for x in value):
            raise ConfigError(f'{key} must be an array of strings like ["gpu", "docker"], got {value!r}')
        value = tuple(value)
        if spec.choices and (unknown := [x for x in value if x not in spec.choices]):
            raise ConfigError(
                f"{key}: unknown {unknown[0]!r}{did_you_mean(unknown[0], spec.choices)}"
                f" (one of {', '.join(spec.choices)})"
            )
        if key == "notify":
            _check_targets(value)
    for x in value if isinstance(value, tuple) else (value,):
        if isinstance(x, int | float) and not isinstance(x, bool):
            if not math.isfinite(x):
                raise ConfigError(f"{key} must be a finite number, got {x}")
            if spec.low is not None and x < spec.low:
                raise ConfigError(f"{key} must be at least {spec.low:g}, got {x:g}")
            if spec.above is not None and x <= spec.above:
                raise ConfigError(f"{key} must be greater than {spec.above:g}, got {x:g}")
            if spec.high is not None and x > spec.high:
                raise ConfigError(f"{key} must be at most {spec.high:g}, got {x:g}")
    return value


def _check_targets(urls: tuple[str, ...]) -> None:
    """``notify`` entries: ``URL`` or ``KIND,KIND URL`` (the URL needs a scheme)."""
    for entry in urls:
        kinds, _, url = entry.strip().rpartition(" ")
        if "://" not in url:
            raise ConfigError(
                f"notify: {entry!r} is not a notification URL: write scheme://..., e.g. ntfys://my-topic"
                " (apprise URLs: https://github.com/caronc/apprise/wiki)"
            )
        for k in (x.strip() for x in kinds.split(",") if x.strip()):
            if k not in NOTIFY_KINDS:
                raise ConfigError(
                    f"notify: unknown kind {k!r} in {entry!r}{did_you_mean(k, NOTIFY_KINDS)}"
                    f" (one of {', '.join(NOTIFY_KINDS)})"
                )


def _check_whole(cfg: Config) -> None:
    if cfg.heartbeat_s >= cfg.lease_s:
        raise ConfigError(
            f"heartbeat_s ({cfg.heartbeat_s:g}) must be less than lease_s ({cfg.lease_s:g}), "
            "or leases expire between heartbeats"
        )


def _unknown(key: str) -> ConfigError:
    hint = did_you_mean(key, KEYS) or f" (known keys: {', '.join(KEYS)})"
    return ConfigError(f"unknown config key {key!r}{hint}")


def parse_value(key: str, text: str) -> Any:
    """A command-line string -> the typed value for ``key`` (None unsets an optional key).

    Numbers and booleans are read as usual (``yes``/``no``/``on``/``off`` too); arrays as TOML
    (``[30, 120]``) or comma-separated (``30,120``); strings as given (surrounding quotes are
    dropped). ``none`` (or an empty string) unsets an optional key.
    """
    if key not in KEYS:
        raise _unknown(key)
    spec = KEYS[key]
    raw = text.strip()
    if spec.optional and raw.lower() in ("", "none", "null", "unset"):
        return None
    value: Any
    if spec.kind == "str":
        value = raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'" else raw
    elif spec.kind == "bool":
        lowered = raw.lower()
        if lowered not in ("true", "false", "yes", "no", "on", "off", "1", "0"):
            raise ConfigError(f"{key} must be true or false, got {text!r}")
        value = lowered in ("true", "yes", "on", "1")
    elif spec.kind in ("floats", "strs") and raw.startswith("["):
        try:
            value = tomllib.loads(f"v = {raw}")["v"] if "\n" not in raw else None
        except (tomllib.TOMLDecodeError, RecursionError):
            value = None
    elif spec.kind == "strs" and not spec.split:
        value = [raw] if raw else []
    elif spec.kind in ("floats", "strs"):
        items = [p.strip() for p in raw.split(",") if p.strip()]
        value = items if spec.kind == "strs" else [_number(key, float, p) for p in items]
    else:
        value = _number(key, int if spec.kind == "int" else float, raw)
    return _check(key, value)


def _number(key: str, kind: type[int] | type[float], raw: str) -> int | float:
    try:
        return kind(raw.replace("_", ""))
    except ValueError:
        raise ConfigError(f"{key} must be {_describe(key)}, got {raw!r}") from None


def format_value(value: Any) -> str:
    """A typed config value -> the string ``config get`` prints (``parse_value`` reads it back)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}" if value == int(value) and abs(value) < 1e15 else repr(value)
    if isinstance(value, tuple):  # as TOML, the way the file writes it: [30, 120, 480]
        return _toml_text(value)
    return str(value)


# --------------------------------------------------------------------------------------------
# Loading


def _parse(text: str, where: str) -> Config:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: bad TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{where}: bad TOML: arrays or tables nested too deeply") from None
    lines = toml_key_lines(text)
    values: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in doc.items():
        line = lines.get((key,), 0)
        if key not in KEYS:
            hint = did_you_mean(key, KEYS)
            if isinstance(value, dict):
                hint += " (the config file is flat: write keys at the top level, without [sections])"
            problems.append(f"{where}:{line}: unknown config key {key!r}{hint}")
            continue
        try:
            values[key] = _check(key, value)
        except ConfigError as exc:
            problems.append(f"{where}:{line}: {exc}")
    if problems:
        raise ConfigError("\n".join(problems))
    cfg = Config(**values)
    try:
        _check_whole(cfg)
    except ConfigError as exc:
        raise ConfigError(f"{where}:{lines.get(('heartbeat_s',), 0)}: {exc}") from None
    return cfg


def load_config(path: Path) -> Config:
    """Read and validate a config file; a missing file gives the defaults.

    Raises ConfigError listing every problem as ``file:line: message``.
    """
    try:
        check_trusted(Path(path), "the config")
        text = read_capped(Path(path), MAX_CONFIG_BYTES, "config").decode("utf-8-sig")
    except FileNotFoundError:
        return Config()
    except TrustError as exc:
        raise ConfigError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc}") from None
    return _parse(text, str(path))


def load_config_lenient(path: Path) -> tuple[Config, str | None]:
    """The config for read-only commands: a file whose content is broken gives its valid keys (the
    rest at their defaults) and the problem, so ``status`` or ``config get`` still work while it
    is broken. A file that cannot be trusted or read still raises ConfigError."""
    try:
        return load_config(path), None
    except ConfigError as exc:
        problem = str(exc)
    # only the content may be broken: a file we must not trust (another owner, writable by
    # others), cannot read, or that is far too big is refused as before
    try:
        check_trusted(Path(path), "the config")
        text = read_capped(Path(path), MAX_CONFIG_BYTES, "config").decode("utf-8-sig")
    except TrustError as exc:
        raise ConfigError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc}") from None
    values: dict[str, Any] = {}
    try:
        docs = [tomllib.loads(text)]
    except (tomllib.TOMLDecodeError, RecursionError):  # line by line: keep each line that reads alone
        docs = []
        for line in text.splitlines():
            try:
                docs.append(tomllib.loads(line))
            except tomllib.TOMLDecodeError:
                continue
    for doc in docs:
        for key, value in doc.items():
            if key in KEYS:
                try:
                    values[key] = _check(key, value)
                except ConfigError:
                    continue
    cfg = Config(**values)
    try:
        _check_whole(cfg)
    except ConfigError:
        cfg = Config(**{k: v for k, v in values.items() if k not in ("heartbeat_s", "lease_s")})
    return cfg, problem


def _problems(text: str, where: str) -> list[str]:
    try:
        _parse(text, where)
    except ConfigError as exc:
        return str(exc).splitlines()
    return []


def _replace_line(text: str, key: str, line_text: str | None) -> str | None:
    """Replace (or, with None, drop) the top-level ``key = ...`` lines of a file that is not valid
    TOML — the first takes the new value, repeats are dropped — so ``config set`` can repair the
    very line that breaks it; None when there is none."""
    out = text.splitlines(keepends=True)
    found = False
    for i, line in enumerate(out):
        stripped = line.lstrip()
        if stripped.startswith("["):
            break
        if not stripped.startswith("#") and stripped.split("=", 1)[0].strip() == key and "=" in stripped:
            new = "" if line_text is None or found else line_text + ("\n" if line.endswith("\n") else "")
            out[i] = new
            found = True
    return "".join(out) if found else None


def get_value(path: Path, key: str) -> str:
    """The value of one key as ``config get`` prints it (``none`` when an optional key is unset)."""
    if key not in KEYS:
        raise _unknown(key)
    value = getattr(load_config(path), key)
    if KEYS[key].kind == "strs" and not KEYS[key].split:
        return _toml_text(value)  # URLs may hold commas: a TOML array reads back unambiguously
    return format_value(value)


# --------------------------------------------------------------------------------------------
# Editing


def _plain(value: Any) -> Any:
    """A typed value -> what tomlkit writes: tuples as arrays, whole floats as integers (4.0 -> 4:
    what the user typed, and still valid for a float key)."""
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return int(value)
    return value


def _toml_text(value: Any) -> str:
    import tomlkit  # only ``config set`` writes TOML: not imported at every start

    return tomlkit.item(_plain(value)).as_string()


def _atomic_write(path: Path, text: str) -> None:
    """Write via a temp file + rename so a watcher never reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".config.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def set_value(path: Path, key: str, value_str: str) -> list[str]:
    """Parse ``value_str`` per the key's type, validate, and write it keeping comments and layout.

    A key that is absent but present as a commented-out ``# key = ...`` line (as in the default
    file) is written in that line's place. ``none`` removes an optional key. The whole resulting
    file must still load, else nothing is written — except that a file already broken may be
    repaired one key at a time: the edit is written when it fixes a problem and adds none (the
    problems left are returned). A missing file is created from the default.
    """
    value = parse_value(key, value_str)
    path = Path(path)
    try:
        check_trusted(path, "the config")
        return _set_value(path, key, value)
    except TrustError as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise ConfigError(
            f"cannot write {path}: {why}: make the fleet home writable, or edit another home (--home)"
        ) from None


def _set_value(path: Path, key: str, value: Any) -> list[str]:
    import tomlkit  # only ``config set`` writes TOML: not imported at every start

    if not path.exists():
        write_default(path)
    try:
        text = read_capped(path, MAX_CONFIG_BYTES, "config").decode("utf-8-sig")
    except (UnicodeDecodeError, TrustError) as exc:
        raise ConfigError(f"{path}: fix the file first, it is not UTF-8 text: {exc}") from None
    before = _problems(text, str(path))
    new_text: str | None = None
    try:
        doc = tomlkit.parse(text)
    except (tomlkit.exceptions.ParseError, RecursionError) as exc:
        # not TOML: the line of this very key may be what breaks it; replace it and see
        new_text = _replace_line(text, key, None if value is None else f"{key} = {_toml_text(value)}")
        if new_text is None:
            raise ConfigError(f"{path}: fix the file first, it is not valid TOML: {exc}") from None
    if new_text is None:
        if value is None:
            if key in doc:
                del doc[key]
        elif key in doc:
            doc[key] = tomlkit.item(_plain(value))
        else:
            new_text = _uncomment(text, key, f"{key} = {_toml_text(value)}")
            if new_text is None:
                doc.add(key, tomlkit.item(_plain(value)))
        if new_text is None:
            new_text = tomlkit.dumps(doc)
    after = _problems(new_text, str(path))
    if after and (not before or len(after) >= len(before) or not set(after) <= set(before)):
        raise ConfigError("\n".join(after))  # never write a file that loads worse than before
    _atomic_write(path, new_text)
    return after


def _uncomment(text: str, key: str, line_text: str) -> str | None:
    """Replace the first top-level ``# key = ...`` line with ``line_text``; None if there is none."""
    out = text.splitlines(keepends=True)
    for i, line in enumerate(out):
        stripped = line.lstrip()
        if stripped.startswith("["):
            return None  # a table starts: keys below it would not be top-level
        body = stripped.lstrip("#").lstrip()
        if stripped.startswith("#") and body.split("=", 1)[0].strip() == key and "=" in body:
            out[i] = line_text + ("\n" if line.endswith("\n") else "")
            return "".join(out)
    return None


def default_text() -> str:
    """The commented default config: every key, commented out at its built-in default."""
    out = [
        "# fleet-tui runtime config. Every key is optional: a commented-out line shows the built-in",
        "# default. Change one with `fleet-tui config set KEY VALUE` (comments survive) or edit",
        "# this file: a running engine picks up valid edits within a second or two, and keeps the",
        "# last good config (reporting the problem) while an edit is broken.",
    ]
    defaults = Config()
    for key, spec in KEYS.items():
        if key in _GROUPS:
            out += ["", f"## {_GROUPS[key]}"]
        value = getattr(defaults, key)
        out.append(f"# {spec.doc}")
        shown = _toml_text(value) if value is not None else (spec.example or '""')
        if key == "max_line_bytes":
            shown += "  # 64 MiB"
        out.append(f"# {key} = {shown}")
    return "\n".join(out) + "\n"


def write_default(path: Path, *, overwrite: bool = False) -> bool:
    """Write the commented default config; returns False (writing nothing) if the file exists."""
    path = Path(path)
    if path.exists() and not overwrite:
        return False
    _atomic_write(path, default_text())
    return True


# --------------------------------------------------------------------------------------------
# Hot reload


class ConfigWatcher:
    """Polls a config file; hands over a new Config on a valid change, an error on a broken one.

    The file is read every poll (it is small) and compared by mtime_ns, size and a content
    hash, so two quick edits within one mtime tick are still seen. A missing file means the
    defaults. Each distinct broken content is reported once; the last good Config stays
    ``current`` until the file is valid again.
    """

    def __init__(self, path: Path, initial: Config | None = None) -> None:
        self.path = Path(path)
        self._sig: tuple[int, int, str] | None = None
        self._error: str | None = None
        self.current: Config
        sig, text = self._read()
        self._sig = sig
        if initial is not None:
            self.current = initial
        else:
            try:
                self.current = Config() if text is None else _parse(text, str(self.path))
            except ConfigError as exc:
                self.current = Config()
                self._error = str(exc)
                self._sig = None  # report it on the first poll

    def _read(self) -> tuple[tuple[int, int, str] | None, str | None]:
        try:
            check_trusted(self.path, "the config")
            st = self.path.stat()
            data = read_capped(self.path, MAX_CONFIG_BYTES, "config")
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            return (0, 0, f"unreadable: {exc}"), None
        except TrustError as exc:
            return (0, 0, str(exc).removeprefix(f"{self.path}: ")), None
        import hashlib  # here: it loads OpenSSL's library, a cost every command paid at start

        return (st.st_mtime_ns, st.st_size, hashlib.sha256(data).hexdigest()), data.decode(
            "utf-8-sig", errors="replace"
        )

    def poll(self) -> tuple[Config | None, str | None]:
        """(new Config, None) after a valid change; (None, message) after a broken one; else
        (None, None)."""
        sig, text = self._read()
        if sig is not None and sig == self._sig:
            return None, None
        if sig is None and self._sig is None and self._error is None:
            return None, None  # still missing
        unchanged_content = sig is not None and self._sig is not None and sig[2] == self._sig[2]
        self._sig = sig
        if unchanged_content and self._error is None:
            return None, None  # touched, not edited
        try:
            if sig is not None and text is None:
                raise ConfigError(f"{self.path}: {sig[2]}")
            new = Config() if text is None else _parse(text, str(self.path))
        except ConfigError as exc:
            msg = f"{exc} (keeping the last good config)"
            if unchanged_content and self._error == msg:
                return None, None
            self._error = msg
            return None, msg
        was_broken, self._error = self._error is not None, None
        if new == self.current and not was_broken:
            return None, None  # e.g. only a comment changed
        self.current = new
        return new, None
