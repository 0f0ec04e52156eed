"""tasks.toml -> TaskSpec list, with every problem reported as ``file:line: message``.

A task file is written by hand and loaded in one go (``fleet-tui load`` queues nothing if
anything is wrong), so the loader must find *every* mistake in one pass and point at the exact
line: a typo'd key, a dependency on a task that does not exist, a ``cwd`` that is missing. TOML
parsers throw positions away, so values come from ``tomllib`` and line numbers from a small
string-aware scanner of the raw text (``toml_key_lines``) that maps each table header and key to
the line it is written on. The format is DESIGN section 8.

``[defaults]`` may hold any task key except ``name``; a task's own value replaces the default
(``env`` tables are merged, the task's variables winning). ``[[task.verify]]`` entries (``run``
or ``agent``) and ``[[task.artifact]]`` entries become the spec's ``verify`` tuple, verifiers
first, in file order.
"""

from __future__ import annotations

import difflib
import math
import re
import subprocess
import tomllib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_tui.scheduler.model import TaskSpec, VerifySpec
from fleet_tui.trust import TrustError, read_capped

__all__ = [
    "TaskFileError",
    "TaskFileResult",
    "did_you_mean",
    "load_taskfile",
    "toml_key_lines",
    "validate_spec",
]

NAME_RE = re.compile(r"^[a-z0-9_-]+$")
#: what a task id looks like (store.new_id): a name of that form would shadow a task's id
ID_LIKE_RE = re.compile(r"^[a-z]-[0-9a-f]{14}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: the largest task file read (a path to /dev/zero or a log must not fill memory)
MAX_TASKFILE_BYTES = 16 * 1024 * 1024
#: integers a task may hold (the store keeps 64-bit integers; nobody needs more than this)
MAX_INT = 2**31 - 1

TASK_KEYS: tuple[str, ...] = (
    "name", "prompt", "cwd", "coder", "model", "command", "git_ref", "priority", "depends_on",
    "timeout_min", "stall_min", "max_retries", "requires", "budget_usd", "setup", "merge", "env",
    "verify", "artifact", "sandbox", "network", "sandbox_rw", "sandbox_ro", "notify_done", "mcp", "continue",
)  # fmt: skip
VERIFY_KEYS: tuple[str, ...] = ("run", "agent", "model", "coder", "timeout_min")
ARTIFACT_KEYS: tuple[str, ...] = ("path", "min_chars", "contains")
TOP_KEYS: tuple[str, ...] = ("defaults", "task")

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class TaskFileError:
    """One problem in a task file, at a line (1-based; 0 when no line applies)."""

    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


@dataclass(frozen=True)
class TaskFileResult:
    """The specs of a file that loaded cleanly, or the errors that stop it from loading.

    ``specs`` holds every task that could be built even when there are errors (useful for a
    partial preview); callers that queue work must check ``ok`` first.
    """

    specs: tuple[TaskSpec, ...] = ()
    errors: tuple[TaskFileError, ...] = ()
    warnings: tuple[TaskFileError, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors


def did_you_mean(word: str, choices: Collection[str]) -> str:
    """`` — did you mean 'x'?`` for the closest choice, or ``""`` when nothing is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" — did you mean {close[0]!r}?" if close else ""


# --------------------------------------------------------------------------------------------
# Line numbers: a scanner of the raw TOML text


#: TOML strings: multi-line basic/literal (closing run may carry up to two content quotes), then
#: one-line basic/literal. Used to skip over strings so their content is never taken for syntax.
_STRING_RE = re.compile(
    r'"""(?:\\.|[^\\])*?"{3,5}|\'\'\'.*?\'{3,5}|"(?:\\.|[^"\\\n])*"|\'[^\'\n]*\'', re.DOTALL
)
_QUOTED_RE = re.compile(r'"((?:\\.|[^"\\])*)"|\'([^\']*)\'')


def _split_dotted(text: str) -> list[str]:
    """Split a (header or key) dotted name, honouring quoted parts: ``a."b.c" . d``."""
    masked = _QUOTED_RE.sub(lambda m: "\0" * len(m.group(0)), text)
    parts, start = [], 0
    for k, ch in enumerate(masked + "."):
        if ch == ".":
            part = text[start:k].strip()
            parts.append(part[1:-1] if part[:1] in "\"'" and part[-1:] == part[:1] else part)
            start = k + 1
    return parts


def toml_key_lines(text: str) -> dict[Path_, int]:
    """Map every table header and key of a (valid) TOML document to its 1-based line.

    Paths index arrays of tables: ``("task", 1, "verify", 0, "run")`` is the ``run`` key of the
    first ``[[task.verify]]`` of the second ``[[task]]``. Keys inside inline tables and arrays are
    not listed; ``line_of`` falls back to the nearest listed ancestor.
    """
    lines: dict[Path_, int] = {}
    aot_counts: dict[Path_, int] = {}
    table: Path_ = ()
    i, n, line = 0, len(text), 1

    def eol(i: int) -> int:
        j = text.find("\n", i)
        return n if j < 0 else j

    def scan(i: int, stops: str, depth_aware: bool = False) -> int:
        """Index of the first char in ``stops`` outside strings/comments (and nesting, if asked)."""
        nonlocal line
        depth = 0
        while i < n:
            ch = text[i]
            if ch in "\"'" and (m := _STRING_RE.match(text, i)):
                line += m.group(0).count("\n")
                i = m.end()
                continue
            if ch == "#" and depth_aware:
                i = eol(i)
                continue
            if ch in stops and depth <= 0:
                return i
            if depth_aware and ch in "[{]}":
                depth += 1 if ch in "[{" else -1
            line += ch == "\n"
            i += 1
        return n

    def resolve(segments: list[str], is_aot: bool) -> Path_:
        path: list[str | int] = []
        for k, seg in enumerate(segments):
            path.append(seg)
            key = tuple(path)
            if k == len(segments) - 1 and is_aot:
                aot_counts[key] = aot_counts.get(key, -1) + 1
                path.append(aot_counts[key])
            elif key in aot_counts:
                path.append(aot_counts[key])
        return tuple(path)

    while i < n:
        ch = text[i]
        if ch in " \t\r\n":
            line += ch == "\n"
            i += 1
        elif ch == "#":
            i = eol(i)
        elif ch == "[":
            is_aot = text.startswith("[[", i)
            start = i + 1 + is_aot
            j = scan(start, "]\n")
            table = resolve(_split_dotted(text[start:j]), is_aot)
            for k in range(1, len(table) + 1):
                lines.setdefault(table[:k], line)
            i = j + 1 + is_aot
        else:
            j = scan(i, "=\n")
            if j < n and text[j] == "=":
                parts = _split_dotted(text[i:j])
                for k in range(1, len(parts) + 1):
                    lines.setdefault((*table, *parts[:k]), line)
                j = scan(j + 1, "\n", depth_aware=True)
            i = j
    return lines


def line_of(lines: Mapping[Path_, int], path: Path_) -> int:
    """The line of ``path`` or of its nearest listed ancestor (0 if none)."""
    for k in range(len(path), 0, -1):
        if path[:k] in lines:
            return lines[path[:k]]
    return 0


# --------------------------------------------------------------------------------------------
# Type checks


def _type_name(value: Any) -> str:
    return {
        bool: "a boolean", int: "an integer", float: "a number", str: "a string",
        list: "an array", dict: "a table",
    }.get(type(value), type(value).__name__)  # fmt: skip


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


_STR_KEYS = ("name", "prompt", "cwd", "coder", "model", "command", "git_ref", "setup", "run", "agent", "path")
_NONEMPTY = ("prompt", "cwd", "coder", "run", "agent", "path")


def _host(x: Any) -> bool:
    """A host name of a ``network`` allowlist (``*.domain`` allowed; no scheme, path or NUL)."""
    return isinstance(x, str) and bool(x.strip()) and not any(c in x for c in "/\0 ")


def _check_value(key: str, v: Any) -> str | None:
    """A type/range message for one scalar, array or env task key, or None when the value is fine."""
    got = f"got {_type_name(v)}"
    if key in _STR_KEYS:
        if not isinstance(v, str):
            return f"{key} must be a string, {got}"
        if key == "name" and not NAME_RE.match(v):
            fixed = re.sub(r"[^a-z0-9_-]+", "-", v.lower()).strip("-") or "task-1"
            return f"bad name {v!r}: use only lowercase letters, digits, '-' and '_' (for example {fixed!r})"
        if key == "name" and ID_LIKE_RE.match(v):
            return (
                f"bad name {v!r}: it looks like a task id, and would hide the task with that id; pick another"
            )
        if key in _NONEMPTY and not v.strip():
            return f"{key} must not be empty"
        if "\0" in v:
            return f"{key} holds a NUL byte (\\0): remove it (a program's arguments cannot carry one)"
    elif key == "priority" and not _is_int(v):
        return f"priority must be an integer (higher runs first), {got}"
    elif key == "priority" and abs(v) > MAX_INT:
        return f"priority must be between {-MAX_INT} and {MAX_INT}, got {v}"
    elif key in ("max_retries", "min_chars") and (not _is_int(v) or v < 0):
        return f"{key} must be a whole number >= 0, {got if not _is_int(v) else v}"
    elif key in ("max_retries", "min_chars") and v > MAX_INT:
        return f"{key} must be at most {MAX_INT}, got {v}"
    elif key in ("timeout_min", "stall_min", "budget_usd"):
        if not _is_num(v):
            return f"{key} must be a number, {got}"
        if not math.isfinite(v):
            return f"{key} must be a finite number, got {v}"
        if v <= 0:
            return f"{key} must be greater than 0, got {v}"
    elif key in ("depends_on", "requires", "contains"):
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            example = '["other-task"]' if key == "depends_on" else '["a", "b"]'
            return f"{key} must be an array of strings like {example}, {got}"
        if any("\0" in x for x in v):
            return f"{key} holds a NUL byte (\\0): remove it"
    elif key == "sandbox" and v not in ("bwrap", "none"):
        later = " (docker is not supported yet)" if v == "docker" else ""
        return f'sandbox must be "bwrap" or "none", got {v!r}{later}'
    elif key == "network" and not (v in ("on", "none") or (isinstance(v, list) and v and all(map(_host, v)))):
        return f'network must be "on", "none" or a list of host names like ["api.anthropic.com"], got {v!r}'
    elif key in ("sandbox_rw", "sandbox_ro") and (
        not isinstance(v, list) or not all(isinstance(x, str) and x.strip() and "\0" not in x for x in v)
    ):
        return f'{key} must be an array of paths like ["~/.cache/pip"], {got}'
    elif key == "mcp" and v not in ("inherit", "fleet-only"):
        return f'mcp must be "inherit" (the user\'s own MCP servers too) or "fleet-only", got {v!r}'
    elif key == "notify_done" and not isinstance(v, bool):
        return f"notify_done must be true or false, {got}"
    elif key == "merge" and v not in ("manual", "auto", "pr"):
        return f'merge must be "manual", "auto" or "pr", got {v!r}'
    elif key == "continue" and v not in ("auto", "fresh"):
        return f'continue must be "auto" or "fresh", got {v!r}'
    elif key == "env":
        if not isinstance(v, dict):
            return f'env must be a table of strings like {{ FOO = "bar" }}, {got}'
        if bad := [k for k, x in v.items() if not isinstance(x, str)]:
            return f'env values must be strings: {", ".join(bad)} (quote numbers: "1")'
        if bad := [k for k in v if not ENV_NAME_RE.match(k)]:
            return f"env names must be letters, digits and _ (not starting with a digit): {bad[0]!r}"
        if bad := [k for k, x in v.items() if "\0" in x]:
            return f"env value of {bad[0]} holds a NUL byte (\\0): remove it"
    return None


# --------------------------------------------------------------------------------------------
# Environment checks (cached: one git call per folder, one availability probe per coder)


class _Checks:
    def __init__(
        self, known_coders: Collection[str], coder_available: Callable[[str], tuple[bool, str]] | None
    ) -> None:
        self.known = tuple(known_coders)
        self.available = coder_available
        #: the config's default coder: a task that names none runs with it, so it is checked too
        self.default_coder: str | None = None
        self._git_cache: dict[tuple[str, ...], tuple[int, str]] = {}
        self._avail: dict[str, tuple[bool, str]] = {}

    def coder(self, coder: str) -> str | None:
        if self.known and coder not in self.known:
            return (
                f"unknown coder {coder!r}{did_you_mean(coder, self.known)} "
                f"(known: {', '.join(sorted(self.known))})"
            )
        if self.available is not None:
            if coder not in self._avail:
                try:
                    self._avail[coder] = self.available(coder)
                except Exception as exc:  # a probe must not break validation
                    self._avail[coder] = (False, f"could not check: {exc}")
            ok, hint = self._avail[coder]
            if not ok:
                return f"coder {coder!r} cannot run on this machine: {hint}".rstrip(": ")
        return None

    def _git(self, *args: str) -> tuple[int, str]:
        """(exit code, stdout) of a git command, cached; (-1, "") when git cannot run."""
        if args not in self._git_cache:
            try:
                proc = subprocess.run(["git", *args], capture_output=True, text=True, timeout=20, check=False)
                self._git_cache[args] = (proc.returncode, proc.stdout.strip())
            except (OSError, subprocess.SubprocessError):
                self._git_cache[args] = (-1, "")
        return self._git_cache[args]

    def git_ref(self, cwd: str, ref: str) -> str | None:
        """A message when ``ref`` cannot be used from ``cwd``, else None."""
        if ref.startswith("-") or "@{" in ref or any(c.isspace() or ord(c) < 0x20 for c in ref):
            return (
                f"git_ref {ref!r} is not a branch, tag or commit name (reflog and upstream forms like "
                "HEAD@{u} move under a running fleet): name a branch, a tag or a commit"
            )
        rc, top = self._git("-C", cwd, "rev-parse", "--show-toplevel")
        if rc != 0:
            return (
                f"git_ref {ref!r} needs a git repository, but {cwd} is not inside one "
                "(run `git init` there, or drop git_ref to run in the folder itself)"
            )
        if self._git("-C", top, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")[0] != 0:
            refs = self._git(
                "-C", top, "for-each-ref", "--format=%(refname:short)", "refs/heads", "refs/tags"
            )
            hint = did_you_mean(ref, refs[1].split()) if refs[0] == 0 else ""
            return f"git_ref {ref!r} is not a branch, tag or commit in {top}{hint}"
        return None


def _needs_prompt(coder: str | None, command: Any) -> bool:
    return not (coder == "shell" and isinstance(command, str) and command.strip())


# --------------------------------------------------------------------------------------------
# The loader


@dataclass
class _Raw:
    """One [[task]] after merging defaults: its values and where each came from."""

    index: int
    header: int
    values: dict[str, Any] = field(default_factory=dict)
    where: dict[str, Path_] = field(default_factory=dict)
    broken: set[str] = field(default_factory=set)  # keys whose value failed a check


class _Report:
    """Collects problems; the same message at the same line (e.g. from [defaults]) counts once."""

    def __init__(self, file: str, lines: Mapping[Path_, int]) -> None:
        self.file, self.lines = file, lines
        self.errors: list[TaskFileError] = []
        self.warnings: list[TaskFileError] = []

    def line(self, at: Path_ | int) -> int:
        return at if isinstance(at, int) else line_of(self.lines, at)

    def err(self, at: Path_ | int, msg: str) -> None:
        e = TaskFileError(self.file, self.line(at), msg)
        if e not in self.errors:
            self.errors.append(e)

    def warn(self, at: Path_ | int, msg: str) -> None:
        self.warnings.append(TaskFileError(self.file, self.line(at), msg))


def _read_taskfile(path: Path) -> str:
    return read_capped(path, MAX_TASKFILE_BYTES, "task file").decode("utf-8-sig")  # an editor's BOM


def load_taskfile(
    path: Path,
    *,
    known_coders: Collection[str],
    existing_names: Collection[str] = (),
    coder_available: Callable[[str], tuple[bool, str]] | None = None,
    default_coder: str | None = None,
) -> TaskFileResult:
    """Parse and validate a task file, reporting every problem with its file:line.

    ``known_coders``: coder names that exist (an empty collection skips the check).
    ``existing_names``: names already in the store — a clash is an error, and ``depends_on``
    may point at them. ``coder_available(name) -> (ok, install hint)`` probes a coder's program.
    Each spec's ``cwd`` is absolute and its ``source`` is ``file:line`` of its ``[[task]]``.
    """
    fname = str(path)
    text = ""
    try:
        text = _read_taskfile(Path(path))
        doc = tomllib.loads(text)
    except FileNotFoundError:
        return TaskFileResult(errors=(TaskFileError(fname, 0, "no such file"),))
    except (OSError, UnicodeDecodeError) as exc:
        return TaskFileResult(errors=(TaskFileError(fname, 0, f"cannot read the file: {exc}"),))
    except TrustError as exc:  # not a regular file, or too large to be a task file
        return TaskFileResult(errors=(TaskFileError(fname, 0, str(exc).removeprefix(f"{path}: ")),))
    except tomllib.TOMLDecodeError as exc:
        line, what = _toml_error_position(str(exc), text)
        return TaskFileResult(errors=(TaskFileError(fname, line, f"bad TOML: {what}"),))
    except RecursionError:
        return TaskFileResult(
            errors=(TaskFileError(fname, 0, "bad TOML: arrays or tables nested too deeply"),)
        )

    rep = _Report(fname, toml_key_lines(text))
    for key in doc:
        if key not in TOP_KEYS:
            hint = did_you_mean(key, TOP_KEYS) or " — a task file holds [defaults] and [[task]] tables"
            rep.err((key,), f"unknown top-level key {key!r}{hint}")
    if "task" not in doc:
        rep.warn(1, "no tasks: add a [[task]] table with a name and a prompt")
    checks = _Checks(known_coders, coder_available)
    checks.default_coder = default_coder
    raws = _check_tasks(doc, Path(path).resolve().parent, checks, existing_names, rep)
    specs = tuple(_build_spec(r.values, f"{fname}:{r.header}") for r in raws if "name" in r.values)
    return TaskFileResult(
        specs=specs,
        errors=tuple(sorted(rep.errors, key=lambda e: e.line)),
        warnings=tuple(sorted(rep.warnings, key=lambda e: e.line)),
    )


def _check_tasks(
    doc: Mapping[str, Any], base: Path, checks: _Checks, existing_names: Collection[str], rep: _Report
) -> list[_Raw]:
    """Every check of section 8 over a parsed document; returns the tasks with usable values."""
    defaults = doc.get("defaults", {})
    if not isinstance(defaults, dict):
        rep.err(("defaults",), "defaults must be a table: write [defaults]")
        defaults = {}
    tasks = doc.get("task", [])
    if not isinstance(tasks, list) or not all(isinstance(t, dict) for t in tasks):
        rep.err(("task",), "task must be an array of tables: write [[task]] per task")
        tasks = []

    default_ok: dict[str, Any] = {}  # [defaults]: checked once
    for key, raw_value in defaults.items():
        value = _shorthand(key, raw_value)
        if key == "name":
            rep.err(("defaults", key), "name cannot be a default: every task needs its own name")
        elif key not in TASK_KEYS:
            rep.err(("defaults", key), f"unknown key {key!r} in [defaults]{did_you_mean(key, TASK_KEYS)}")
        elif _check_table_key(key, value, ("defaults", key), rep):
            default_ok[key] = value

    raws: list[_Raw] = []
    for idx, table in enumerate(tasks):
        raw = _Raw(index=idx, header=rep.line(("task", idx)))
        raw.values = dict(default_ok)
        raw.where = {key: ("defaults", key) for key in default_ok}
        for key, raw_value in table.items():
            value = _shorthand(key, raw_value)
            at: Path_ = ("task", idx, key)
            if key not in TASK_KEYS:
                rep.err(at, f"unknown key {key!r}{did_you_mean(key, TASK_KEYS)}")
            elif not _check_table_key(key, value, at, rep):
                raw.broken.add(key)
                raw.values.pop(key, None)
            else:
                if key == "env" and isinstance(raw.values.get("env"), dict):
                    value = {**raw.values["env"], **value}
                raw.values[key], raw.where[key] = value, at
        raws.append(raw)

    seen: dict[str, int] = {}
    for raw in raws:
        _check_task(raw, base, checks, rep)
        name = raw.values.get("name")
        if name is None:
            continue
        line = rep.line(raw.where["name"])
        if name in seen:
            rep.err(line, f"duplicate task name {name!r} (first used at line {seen[name]})")
        elif name in existing_names and _status_of(existing_names, name) not in ("done", "cancelled"):
            status = _status_of(existing_names, name) or "not finished"
            rep.err(
                line,
                f"a task named {name!r} is {status}: names are unique among unfinished tasks "
                "(pick another name, or let that task finish or cancel it first)",
            )
        else:
            seen[name] = line

    named = {r.values["name"]: r for r in raws if "name" in r.values}
    for raw in raws:
        for dep in raw.values.get("depends_on", []):
            if dep not in named and dep not in existing_names:
                hint = did_you_mean(dep, [*named, *existing_names])
                rep.err(
                    raw.where["depends_on"],
                    f"depends_on {dep!r}: no such task in this file or the queue{hint}",
                )
    graph = {n: [d for d in r.values.get("depends_on", []) if d in named] for n, r in named.items()}
    for cycle in _cycles(graph):
        path = " -> ".join([*cycle, cycle[0]])
        rep.err(
            named[cycle[0]].where["depends_on"], f"depends_on cycle: {path} (no task in it could ever start)"
        )
    return raws


def _status_of(existing: Collection[str], name: str) -> str | None:
    """The status of an existing task when ``existing`` maps names to statuses (a finished task's
    name may be taken again), else None."""
    return existing.get(name) if isinstance(existing, Mapping) else None


def _check_task(raw: _Raw, base: Path, checks: _Checks, rep: _Report) -> None:
    """Checks that need more than one key, or the machine: name, prompt, coders, cwd, git_ref."""
    v, where = raw.values, raw.where
    if "name" not in v and "name" not in raw.broken:
        rep.err(raw.header, 'task has no name: add name = "..." (lowercase letters, digits, - and _)')
    coder = v.get("coder")
    if "prompt" not in v and "prompt" not in raw.broken and _needs_prompt(coder, v.get("command")):
        label = v.get("name", f"#{raw.index + 1}")
        rep.err(
            raw.header,
            f'task {label!r} has no prompt: add prompt = "..." (or coder = "shell" with a command)',
        )
    if coder == "shell" and "command" not in v and "command" not in raw.broken:
        rep.err(
            where["coder"],
            'the shell coder runs a command: add command = "..." (it gets the prompt in $FLEET_PROMPT)',
        )
    if v.get("command") and coder not in (None, "shell"):
        rep.warn(where["command"], f"command is only run by the shell coder; coder {coder!r} ignores it")
    if coder is not None and (msg := checks.coder(coder)):
        rep.err(where["coder"], msg)
    elif (
        coder is None
        and "coder" not in raw.broken
        and checks.default_coder
        and (msg := checks.coder(checks.default_coder))
    ):
        rep.err(
            raw.header,
            f"{msg} (it is the default coder: name another with coder = ..., or "
            "`fleet-tui config set default_coder NAME`)",
        )
    for k, ver in enumerate(_entries(v.get("verify"))):
        if "coder" in ver and (msg := checks.coder(ver["coder"])):
            rep.err((*where["verify"], k, "coder"), f"verifier: {msg}")
    for key in ("sandbox_rw", "sandbox_ro"):  # relative paths start at the file's folder, like cwd
        if isinstance(v.get(key), list):
            v[key] = [str((base / Path(x).expanduser()).resolve()) for x in v[key]]
    cwd_raw = v.get("cwd", ".")
    cwd = str((base / Path(cwd_raw).expanduser()).resolve())
    v["cwd"] = cwd
    if not Path(cwd).is_dir():
        what = "is not a folder" if Path(cwd).exists() else "does not exist"
        rep.err(where.get("cwd", raw.header),
                f"cwd {cwd_raw!r} {what} ({cwd}; a relative cwd starts at {base})")  # fmt: skip
    elif "git_ref" in v and (msg := checks.git_ref(cwd, v["git_ref"])):
        rep.err(where["git_ref"], msg)
    if v.get("merge") == "pr" and not v.get("git_ref"):
        rep.err(
            where.get("merge", raw.header), 'merge = "pr" needs git_ref (the branch a pull request targets)'
        )


def _entries(value: Any) -> list[dict[str, Any]]:
    return [e for e in value if isinstance(e, dict)] if isinstance(value, list) else []


def _shorthand(key: str, value: Any) -> Any:
    """``verify`` and ``artifact`` as people write them first: ``verify = "pytest -q"`` or a list
    of commands (each a ``[[task.verify]] run = ...``), ``artifact = "report.md"`` or a list of
    paths (each a ``[[task.artifact]] path = ...``); tables may sit in the same list. Anything
    else is left as it is, for the check to name."""
    if key not in ("verify", "artifact"):
        return value
    field = "run" if key == "verify" else "path"
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        return value
    return [{field: e} if isinstance(e, str) else e for e in items]


def _check_table_key(key: str, value: Any, at: Path_, rep: _Report) -> bool:
    """Check one task (or default) key, including verify/artifact entries. True when usable."""
    if key not in ("verify", "artifact"):
        msg = _check_value(key, value)
        if msg:
            rep.err(at, msg)
        return msg is None
    if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
        what = "a command" if key == "verify" else "a file's path"
        rep.err(at, f"{key} must be {what}, a list of them, or [[task.{key}]] tables")
        return False
    n_errors = len(rep.errors)
    allowed = VERIFY_KEYS if key == "verify" else ARTIFACT_KEYS
    for k, entry in enumerate(value):
        for sub, sv in entry.items():
            if sub not in allowed:
                rep.err((*at, k, sub), f"unknown key {sub!r} in [[task.{key}]]{did_you_mean(sub, allowed)}")
            elif msg := _check_value(sub, sv):
                rep.err((*at, k, sub), msg)
        if key == "artifact" and "path" not in entry:
            rep.err((*at, k), 'a [[task.artifact]] needs path = "file"')
        elif key == "verify" and ("run" in entry) == ("agent" in entry):
            rep.err(
                (*at, k),
                'a [[task.verify]] needs exactly one of run = "command" or agent = "review instructions"',
            )
        elif key == "verify" and "run" in entry and ("model" in entry or "coder" in entry):
            rep.err((*at, k), "model and coder apply to agent verifiers only")
    return len(rep.errors) == n_errors


def _cycles(graph: Mapping[str, list[str]]) -> list[list[str]]:
    """Each dependency cycle once, as the names along it, starting at its earliest-listed task.

    A depth-first walk with an explicit stack: a chain thousands of tasks deep is fine."""
    order = {n: k for k, n in enumerate(graph)}
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()

    for root in graph:
        if root in state:
            continue
        state[root] = 1
        path = [root]
        where: dict[str, int] = {root: 0}  # position on the path, for slicing out a cycle
        todo = [iter(graph.get(root, []))]
        while todo:
            dep = next(todo[-1], None)
            if dep is None:
                todo.pop()
                done = path.pop()
                where.pop(done, None)
                state[done] = 2
                continue
            if state.get(dep) == 1:
                cyc = path[where[dep] :]
                if frozenset(cyc) not in seen:
                    seen.add(frozenset(cyc))
                    start = min(range(len(cyc)), key=lambda k: order[cyc[k]])
                    found.append(cyc[start:] + cyc[:start])
            elif dep not in state:
                state[dep] = 1
                where[dep] = len(path)
                path.append(dep)
                todo.append(iter(graph.get(dep, [])))
    return found


def _build_spec(v: Mapping[str, Any], source: str | None) -> TaskSpec:
    def num(key: str, d: Mapping[str, Any] = v) -> float | None:
        return float(d[key]) if key in d else None

    verify = [
        VerifySpec(kind="run", run=e["run"], timeout_min=num("timeout_min", e)) if "run" in e else
        VerifySpec(kind="agent", agent=e.get("agent"), coder=e.get("coder"), model=e.get("model"),
                   timeout_min=num("timeout_min", e))
        for e in _entries(v.get("verify"))
    ] + [
        VerifySpec(kind="artifact", path=e.get("path"), min_chars=int(e.get("min_chars", 0)),
                   contains=tuple(e.get("contains", ())))
        for e in _entries(v.get("artifact"))
    ]  # fmt: skip
    return TaskSpec(
        name=v["name"], prompt=v.get("prompt", ""), cwd=v.get("cwd", "."), coder=v.get("coder"),
        model=v.get("model"), command=v.get("command"), git_ref=v.get("git_ref"),
        priority=v.get("priority", 0), depends_on=tuple(v.get("depends_on", ())),
        timeout_min=num("timeout_min"), stall_min=num("stall_min"), max_retries=v.get("max_retries"),
        requires=tuple(v.get("requires", ())), verify=tuple(verify), budget_usd=num("budget_usd"),
        setup=v.get("setup"), merge=v.get("merge", "manual"),
        env=tuple(sorted(v.get("env", {}).items())), source=source, sandbox=v.get("sandbox"),
        network=_network(v.get("network")), sandbox_rw=tuple(v.get("sandbox_rw", ())),
        sandbox_ro=tuple(v.get("sandbox_ro", ())),
        notify_done=bool(v.get("notify_done", False)), mcp=v.get("mcp"), continue_mode=v.get("continue"),
    )  # fmt: skip


def _network(value: Any) -> tuple[str, ...] | None:
    """``network``: "on" (or absent) -> None, "none" -> (), a host list -> the hosts."""
    if value is None or value == "on":
        return None
    return () if value == "none" else tuple(value)


_POS_RE = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")
_END_RE = re.compile(r"\s*\(at end of document\)\s*$")


def _toml_error_position(message: str, text: str) -> tuple[int, str]:
    """tomllib's "Msg (at line L, column C)" -> (L, "Msg (column C)")."""
    if m := _POS_RE.search(message):
        return int(m.group(1)), f"{message[: m.start()]} (column {m.group(2)})"
    last = max(1, len(text.splitlines()))
    return last, _END_RE.sub(" at the end of the file (an unclosed string, array or table?)", message)


# --------------------------------------------------------------------------------------------
# Single tasks (fleet-tui add, the cockpit's new-task form)


def validate_spec(
    spec: TaskSpec,
    *,
    known_coders: Collection[str],
    existing_names: Collection[str] = (),
    coder_available: Callable[[str], tuple[bool, str]] | None = None,
    default_coder: str | None = None,
) -> list[str]:
    """Problems with one task built outside a file (messages without file:line; [] when fine).

    The same checks as a task file (the spec is turned back into a [[task]] table); a relative
    ``cwd`` is taken from the current folder, and ``depends_on`` must name queued tasks.
    """
    table = spec_table(spec)
    rep = _Report("", {})
    checks = _Checks(known_coders, coder_available)
    checks.default_coder = default_coder
    _check_tasks({"task": [table]}, Path.cwd(), checks, existing_names, rep)
    return [e.message for e in rep.errors]


def spec_table(spec: TaskSpec) -> dict[str, Any]:
    """One task as its ``[[task]]`` table (what ``validate_spec`` checks and ``edit`` shows)."""
    table: dict[str, Any] = {
        "name": spec.name,
        "cwd": spec.cwd,
        "priority": spec.priority,
        "merge": spec.merge,
    }
    for key in ("prompt", "coder", "model", "command", "git_ref", "setup", "timeout_min", "stall_min",
                "max_retries", "budget_usd"):  # fmt: skip
        value = getattr(spec, key)
        if value is not None and not (key == "prompt" and not value.strip()):
            table[key] = value
    for key in ("depends_on", "requires"):
        if getattr(spec, key):
            table[key] = list(getattr(spec, key))
    if spec.env:
        table["env"] = dict(spec.env)
    if spec.sandbox is not None:
        table["sandbox"] = spec.sandbox
    if spec.continue_mode is not None:
        table["continue"] = spec.continue_mode
    if spec.network is not None:
        table["network"] = list(spec.network) or "none"
    for key in ("sandbox_rw", "sandbox_ro"):
        if getattr(spec, key):
            table[key] = list(getattr(spec, key))
    if spec.notify_done:
        table["notify_done"] = True
    if spec.mcp is not None:
        table["mcp"] = spec.mcp
    fields_of = {"run": ("run", "timeout_min"), "agent": ("agent", "coder", "model", "timeout_min"),
                 "artifact": ("path", "min_chars", "contains")}  # fmt: skip
    for ver in spec.verify:
        entry = {k: getattr(ver, k) for k in fields_of[ver.kind] if getattr(ver, k) not in (None, ())}
        if ver.kind != "artifact":
            entry.setdefault(ver.kind, "")
        if "contains" in entry:
            entry["contains"] = list(entry["contains"])
        table.setdefault("artifact" if ver.kind == "artifact" else "verify", []).append(entry)
    return table
