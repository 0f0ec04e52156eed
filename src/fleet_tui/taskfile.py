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
import re
import subprocess
import tomllib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_tui.scheduler.model import TaskSpec, VerifySpec

__all__ = [
    "TaskFileError",
    "TaskFileResult",
    "did_you_mean",
    "load_taskfile",
    "toml_key_lines",
    "validate_spec",
]

NAME_RE = re.compile(r"^[a-z0-9_-]+$")

TASK_KEYS: tuple[str, ...] = (
    "name", "prompt", "cwd", "coder", "model", "command", "git_ref", "priority", "depends_on",
    "timeout_min", "stall_min", "max_retries", "requires", "budget_usd", "setup", "merge", "env",
    "verify", "artifact",
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


def _split_dotted(text: str) -> list[str]:
    """Split a (header or key) dotted name, honouring quoted parts: ``a."b.c" . d``."""
    parts: list[str] = []
    cur: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "\"'":
            end = i + 1
            while end < len(text) and text[end] != ch:
                end += 2 if (ch == '"' and text[end] == "\\") else 1
            cur.append(text[i + 1 : end])
            i = end + 1
            continue
        if ch == ".":
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
        i += 1
    parts.append("".join(cur).strip())
    return parts


def toml_key_lines(text: str) -> dict[Path_, int]:
    """Map every table header and key of a (valid) TOML document to its 1-based line.

    Paths index arrays of tables: ``("task", 1, "verify", 0, "run")`` is the ``run`` key of the
    first ``[[task.verify]]`` of the second ``[[task]]``. Keys inside inline tables and arrays are
    not listed; use ``line_of`` which falls back to the nearest listed ancestor.
    """
    lines: dict[Path_, int] = {}
    aot_counts: dict[Path_, int] = {}
    table: Path_ = ()
    i, n, line = 0, len(text), 1

    def skip_string(i: int) -> int:
        """``i`` at an opening quote; returns the index just past the closing quote(s)."""
        nonlocal line
        q = text[i]
        if text.startswith(q * 3, i):
            j = i + 3
            while j < n:
                if q == '"' and text[j] == "\\":
                    if j + 1 < n and text[j + 1] == "\n":
                        line += 1
                    j += 2
                    continue
                if text.startswith(q * 3, j):
                    j += 3
                    while j < n and text[j] == q:  # up to two quotes may end the content
                        j += 1
                    return j
                if text[j] == "\n":
                    line += 1
                j += 1
            return j
        j = i + 1
        while j < n and text[j] != q and text[j] != "\n":
            j += 2 if (q == '"' and text[j] == "\\") else 1
        return j + 1

    def skip_value(i: int) -> int:
        """Skip a value to the end of its statement (handles nesting, strings, comments)."""
        nonlocal line
        depth = 0
        while i < n:
            ch = text[i]
            if ch in "\"'":
                i = skip_string(i)
                continue
            if ch == "#":
                while i < n and text[i] != "\n":
                    i += 1
                continue
            if ch in "[{":
                depth += 1
            elif ch in "]}":
                depth -= 1
            elif ch == "\n":
                if depth <= 0:
                    return i
                line += 1
            i += 1
        return i

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
        if ch == "\n":
            line += 1
            i += 1
        elif ch in " \t\r":
            i += 1
        elif ch == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif ch == "[":
            is_aot = text.startswith("[[", i)
            j = i + (2 if is_aot else 1)
            start = j
            while j < n and text[j] != "]" and text[j] != "\n":
                if text[j] in "\"'":
                    j = skip_string(j)
                else:
                    j += 1
            table = resolve(_split_dotted(text[start:j]), is_aot)
            for k in range(1, len(table) + 1):
                lines.setdefault(table[:k], line)
            i = j + (2 if is_aot else 1)
        else:
            j = i
            while j < n and text[j] not in "=\n":
                if text[j] in "\"'":
                    j = skip_string(j)
                else:
                    j += 1
            if j >= n or text[j] != "=":  # not a key line (cannot happen in valid TOML)
                i = j
                continue
            parts = _split_dotted(text[i:j])
            for k in range(1, len(parts) + 1):
                lines.setdefault((*table, *parts[:k]), line)
            i = skip_value(j + 1)
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


def _check_value(key: str, v: Any) -> str | None:
    """A type/range message for one scalar or list task key, or None when the value is fine."""
    got = f"got {_type_name(v)}"
    if key in ("name", "prompt", "cwd", "coder", "model", "command", "git_ref", "setup"):
        if not isinstance(v, str):
            return f"{key} must be a string, {got}"
        if key == "name" and not NAME_RE.match(v):
            return (
                f"bad name {v!r}: use only lowercase letters, digits, '-' and '_' "
                f"(for example {re.sub(r'[^a-z0-9_-]+', '-', v.lower()).strip('-') or 'task-1'!r})"
            )
        if key in ("coder", "cwd", "prompt") and not v.strip():
            return f"{key} must not be empty"
    elif key == "priority":
        if not _is_int(v):
            return f"priority must be an integer (higher runs first), {got}"
    elif key == "max_retries":
        if not _is_int(v) or v < 0:
            return f"max_retries must be a whole number >= 0, {got if not _is_int(v) else v}"
    elif key in ("timeout_min", "stall_min", "budget_usd"):
        if not _is_num(v):
            return f"{key} must be a number, {got}"
        if v <= 0:
            return f"{key} must be greater than 0, got {v}"
    elif key in ("depends_on", "requires", "contains"):
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            example = '["other-task"]' if key == "depends_on" else '["a", "b"]'
            return f"{key} must be an array of strings like {example}, {got}"
    elif key == "merge":
        if v not in ("manual", "auto"):
            return f'merge must be "manual" or "auto", got {v!r}'
    elif key == "env":
        if not isinstance(v, dict):
            return f'env must be a table of strings like {{ FOO = "bar" }}, {got}'
        bad = [k for k, x in v.items() if not isinstance(x, str)]
        if bad:
            return f'env values must be strings: {", ".join(bad)} (quote numbers: "1")'
    elif key == "min_chars":
        if not _is_int(v) or v < 0:
            return f"min_chars must be a whole number >= 0, {got if not _is_int(v) else v}"
    elif key in ("run", "agent", "path") and (not isinstance(v, str) or not v.strip()):
        return f"{key} must be a non-empty string, {got}"
    return None


# --------------------------------------------------------------------------------------------
# Environment checks (cached: one git call per folder, one availability probe per coder)


class _Checks:
    def __init__(
        self, known_coders: Collection[str], coder_available: Callable[[str], tuple[bool, str]] | None
    ) -> None:
        self.known = tuple(known_coders)
        self.available = coder_available
        self._git: dict[str, str | None] = {}
        self._ref: dict[tuple[str, str], bool] = {}
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

    def git_top(self, cwd: str) -> str | None:
        if cwd not in self._git:
            try:
                proc = subprocess.run(
                    ["git", "-C", cwd, "rev-parse", "--show-toplevel"],
                    capture_output=True, text=True, timeout=20, check=False,
                )  # fmt: skip
                self._git[cwd] = proc.stdout.strip() if proc.returncode == 0 else None
            except (OSError, subprocess.SubprocessError):
                self._git[cwd] = None
        return self._git[cwd]

    def git_ref(self, cwd: str, ref: str) -> str | None:
        """A message when ``ref`` cannot be used from ``cwd``, else None."""
        top = self.git_top(cwd)
        if top is None:
            return (
                f"git_ref {ref!r} needs a git repository, but {cwd} is not inside one "
                f"(run `git init` there, or drop git_ref to run in the folder itself)"
            )
        if (top, ref) not in self._ref:
            try:
                proc = subprocess.run(
                    ["git", "-C", top, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                    capture_output=True, text=True, timeout=20, check=False,
                )  # fmt: skip
                self._ref[(top, ref)] = proc.returncode == 0
            except (OSError, subprocess.SubprocessError):
                self._ref[(top, ref)] = True  # cannot tell: let the worktree step decide
        if not self._ref[(top, ref)]:
            return f"git_ref {ref!r} is not a branch, tag or commit in {top}"
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


def load_taskfile(
    path: Path,
    *,
    known_coders: Collection[str],
    existing_names: Collection[str] = (),
    coder_available: Callable[[str], tuple[bool, str]] | None = None,
) -> TaskFileResult:
    """Parse and validate a task file, reporting every problem with its file:line.

    ``known_coders``: coder names that exist (an empty collection skips the check).
    ``existing_names``: names already in the store — a clash is an error, and ``depends_on``
    may point at them. ``coder_available(name) -> (ok, install hint)`` probes a coder's program.
    """
    fname = str(path)
    errors: list[TaskFileError] = []
    warnings: list[TaskFileError] = []

    def err(line: int, msg: str) -> None:
        errors.append(TaskFileError(fname, line, msg))

    def warn(line: int, msg: str) -> None:
        warnings.append(TaskFileError(fname, line, msg))

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return TaskFileResult(errors=(TaskFileError(fname, 0, "no such file"),))
    except (OSError, UnicodeDecodeError) as exc:
        return TaskFileResult(errors=(TaskFileError(fname, 0, f"cannot read the file: {exc}"),))
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line, what = _toml_error_position(str(exc), text)
        return TaskFileResult(errors=(TaskFileError(fname, line, f"bad TOML: {what}"),))

    lines = toml_key_lines(text)
    base = Path(path).resolve().parent
    checks = _Checks(known_coders, coder_available)

    for key in doc:
        if key not in TOP_KEYS:
            hint = did_you_mean(key, TOP_KEYS) or " — a task file holds [defaults] and [[task]] tables"
            err(line_of(lines, (key,)), f"unknown top-level key {key!r}{hint}")

    defaults = doc.get("defaults", {})
    if not isinstance(defaults, dict):
        err(line_of(lines, ("defaults",)), "defaults must be a table: write [defaults]")
        defaults = {}
    tasks = doc.get("task", [])
    if not isinstance(tasks, list) or not all(isinstance(t, dict) for t in tasks):
        err(line_of(lines, ("task",)), "task must be an array of tables: write [[task]] per task")
        tasks = []
    if not tasks and "task" not in doc:
        warn(1, "no tasks: add a [[task]] table with a name and a prompt")

    # [defaults]: keys and types, checked once
    default_ok: dict[str, Any] = {}
    for key, value in defaults.items():
        at: Path_ = ("defaults", key)
        if key == "name":
            err(line_of(lines, at), "name cannot be a default: every task needs its own name")
        elif key not in TASK_KEYS:
            err(line_of(lines, at), f"unknown key {key!r} in [defaults]{did_you_mean(key, TASK_KEYS)}")
        elif _check_table_key(key, value, at, lines, err):
            default_ok[key] = value

    raws: list[_Raw] = []
    for idx, table in enumerate(tasks):
        raw = _Raw(index=idx, header=line_of(lines, ("task", idx)))
        for key, value in default_ok.items():
            raw.values[key] = value
            raw.where[key] = ("defaults", key)
        for key, value in table.items():
            tat: Path_ = ("task", idx, key)
            if key not in TASK_KEYS:
                err(line_of(lines, tat), f"unknown key {key!r}{did_you_mean(key, TASK_KEYS)}")
                continue
            if not _check_table_key(key, value, tat, lines, err):
                raw.broken.add(key)
                raw.values.pop(key, None)
                continue
            if key == "env" and isinstance(raw.values.get("env"), dict):
                value = {**raw.values["env"], **value}
            raw.values[key] = value
            raw.where[key] = tat
        raws.append(raw)

    # names: required, unique in the file, not already queued
    seen: dict[str, int] = {}
    for raw in raws:
        name = raw.values.get("name")
        if not isinstance(name, str):
            if "name" not in raw.broken:
                err(raw.header, 'task has no name: add name = "..." (lowercase letters, digits, - and _)')
            continue
        at_line = line_of(lines, raw.where["name"])
        if name in seen:
            err(at_line, f"duplicate task name {name!r} (first used at line {seen[name]})")
        elif name in existing_names:
            err(at_line, f"name already queued: {name!r} (pick another name, or cancel the queued task)")
        else:
            seen[name] = at_line

    # prompt (or command for the shell coder), coder, cwd, git_ref
    for raw in raws:
        v = raw.values
        coder = v.get("coder")
        if "prompt" not in v and "prompt" not in raw.broken and _needs_prompt(coder, v.get("command")):
            err(
                raw.header,
                f"task {v.get('name', '#' + str(raw.index + 1))!r} has no prompt: "
                'add prompt = "..." (or coder = "shell" with a command)',
            )
        if v.get("command") and coder not in (None, "shell"):
            warn(
                line_of(lines, raw.where["command"]),
                f"command is only run by the shell coder; coder {coder!r} ignores it",
            )
        if isinstance(coder, str):
            msg = checks.coder(coder)
            if msg:
                err(line_of(lines, raw.where["coder"]), msg)
        for k, ver in enumerate(_entries(v.get("verify"))):
            vc = ver.get("coder")
            if isinstance(vc, str):
                msg = checks.coder(vc)
                if msg:
                    base_at = raw.where["verify"]
                    err(line_of(lines, (*base_at, k, "coder")), f"verifier: {msg}")
        cwd_raw = v.get("cwd", ".")
        cwd = str((base / Path(cwd_raw).expanduser()).resolve())
        cwd_line = line_of(lines, raw.where.get("cwd", ())) or raw.header
        cwd_ok = Path(cwd).is_dir()
        if not cwd_ok:
            what = "is not a folder" if Path(cwd).exists() else "does not exist"
            err(cwd_line, f"cwd {cwd_raw!r} {what} ({cwd}; relative paths start at this file's folder)")
        v["cwd"] = cwd
        ref = v.get("git_ref")
        if isinstance(ref, str) and cwd_ok:
            msg = checks.git_ref(cwd, ref)
            if msg:
                err(line_of(lines, raw.where["git_ref"]), msg)

    # depends_on: dangling and cycles
    names = {r.values["name"]: r for r in raws if isinstance(r.values.get("name"), str)}
    for raw in raws:
        deps = raw.values.get("depends_on", [])
        at_line = line_of(lines, raw.where.get("depends_on", ())) or raw.header
        for dep in deps:
            if dep not in names and dep not in existing_names:
                known = list(names) + list(existing_names)
                err(
                    at_line,
                    f"depends_on {dep!r}: no such task in this file or the queue{did_you_mean(dep, known)}",
                )
    for cycle in _cycles(
        {n: [d for d in r.values.get("depends_on", []) if d in names] for n, r in names.items()}
    ):
        first = names[cycle[0]]
        at_line = line_of(lines, first.where.get("depends_on", ())) or first.header
        err(at_line, f"depends_on cycle: {' -> '.join([*cycle, cycle[0]])} (no task in it could ever start)")

    specs = tuple(
        _build_spec(raw, f"{fname}:{raw.header}") for raw in raws if isinstance(raw.values.get("name"), str)
    )
    errors.sort(key=lambda e: e.line)
    warnings.sort(key=lambda e: e.line)
    return TaskFileResult(specs=specs, errors=tuple(errors), warnings=tuple(warnings))


def _entries(value: Any) -> list[dict[str, Any]]:
    return [e for e in value if isinstance(e, dict)] if isinstance(value, list) else []


def _check_table_key(
    key: str, value: Any, at: Path_, lines: Mapping[Path_, int], err: Callable[[int, str], None]
) -> bool:
    """Check one task (or default) key, including verify/artifact entries. True when usable."""
    if key in ("verify", "artifact"):
        if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
            err(line_of(lines, at), f"{key} must be written as [[task.{key}]] tables")
            return False
        ok = True
        allowed = VERIFY_KEYS if key == "verify" else ARTIFACT_KEYS
        for k, entry in enumerate(value):
            eat: Path_ = (*at, k)
            for sub, sv in entry.items():
                if sub not in allowed:
                    err(
                        line_of(lines, (*eat, sub)),
                        f"unknown key {sub!r} in [[task.{key}]]{did_you_mean(sub, allowed)}",
                    )
                    ok = False
                    continue
                msg = _check_value(sub, sv)
                if msg:
                    err(line_of(lines, (*eat, sub)), msg)
                    ok = False
            if key == "verify" and ("run" in entry) == ("agent" in entry):
                err(
                    line_of(lines, eat),
                    'a [[task.verify]] needs exactly one of run = "command" or agent = "review instructions"',
                )
                ok = False
            if key == "verify" and "run" in entry and ("model" in entry or "coder" in entry):
                err(line_of(lines, eat), "model and coder apply to agent verifiers only")
                ok = False
            if key == "artifact" and "path" not in entry:
                err(line_of(lines, eat), 'a [[task.artifact]] needs path = "file"')
                ok = False
        return ok
    msg = _check_value(key, value)
    if msg:
        err(line_of(lines, at), msg)
        return False
    return True


def _cycles(graph: Mapping[str, list[str]]) -> list[list[str]]:
    """Each dependency cycle once, as the names along it, starting at its earliest-listed task."""
    order = {n: k for k, n in enumerate(graph)}
    state: dict[str, int] = {}  # 1 = on stack, 2 = done
    found: list[list[str]] = []
    seen_sets: set[frozenset[str]] = set()

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for dep in graph.get(node, []):
            if state.get(dep) == 1:
                cyc = stack[stack.index(dep) :]
                key = frozenset(cyc)
                if key not in seen_sets:
                    seen_sets.add(key)
                    start = min(range(len(cyc)), key=lambda k: order[cyc[k]])
                    found.append(cyc[start:] + cyc[:start])
            elif state.get(dep) is None:
                visit(dep, stack)
        stack.pop()
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [])
    return found


def _verify_specs(values: Mapping[str, Any]) -> tuple[VerifySpec, ...]:
    out: list[VerifySpec] = []
    for e in _entries(values.get("verify")):
        tmo = e.get("timeout_min")
        tmo_f = float(tmo) if tmo is not None and _is_num(tmo) else None
        if "run" in e:
            out.append(VerifySpec(kind="run", run=e["run"], timeout_min=tmo_f))
        else:
            out.append(
                VerifySpec(
                    kind="agent",
                    agent=e.get("agent"),
                    coder=e.get("coder"),
                    model=e.get("model"),
                    timeout_min=tmo_f,
                )
            )
    for e in _entries(values.get("artifact")):
        out.append(
            VerifySpec(
                kind="artifact",
                path=e.get("path"),
                min_chars=int(e.get("min_chars", 0)),
                contains=tuple(e.get("contains", ())),
            )
        )
    return tuple(out)


def _build_spec(raw: _Raw, source: str) -> TaskSpec:
    v = raw.values

    def num(key: str) -> float | None:
        return float(v[key]) if key in v else None

    return TaskSpec(
        name=v["name"],
        prompt=v.get("prompt", ""),
        cwd=v.get("cwd", "."),
        coder=v.get("coder"),
        model=v.get("model"),
        command=v.get("command"),
        git_ref=v.get("git_ref"),
        priority=v.get("priority", 0),
        depends_on=tuple(v.get("depends_on", ())),
        timeout_min=num("timeout_min"),
        stall_min=num("stall_min"),
        max_retries=v.get("max_retries"),
        requires=tuple(v.get("requires", ())),
        verify=_verify_specs(v),
        budget_usd=num("budget_usd"),
        setup=v.get("setup"),
        merge=v.get("merge", "manual"),
        env=tuple(sorted(v.get("env", {}).items())),
        source=source,
    )


_POS_RE = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")
_END_RE = re.compile(r"\s*\(at end of document\)\s*$")


def _toml_error_position(message: str, text: str) -> tuple[int, str]:
    """tomllib's "Msg (at line L, column C)" -> (L, "Msg (column C)"); tomlkit as a fallback."""
    m = _POS_RE.search(message)
    if m:
        return int(m.group(1)), f"{message[: m.start()]} (column {m.group(2)})"
    if _END_RE.search(message):
        return max(1, text.count("\n") + (0 if text.endswith("\n") else 1)), _END_RE.sub(
            " at the end of the file (an unclosed string, array or table?)", message
        )
    try:  # tomlkit reports line/col as attributes
        import tomlkit
        from tomlkit.exceptions import ParseError

        try:
            tomlkit.parse(text)
        except ParseError as exc:
            return exc.line, str(exc)
    except ImportError:  # pragma: no cover - tomlkit is a dependency
        pass
    return 1, message


# --------------------------------------------------------------------------------------------
# Single tasks (fleet-tui add, the cockpit's new-task form)


def validate_spec(
    spec: TaskSpec,
    *,
    known_coders: Collection[str],
    existing_names: Collection[str] = (),
    coder_available: Callable[[str], tuple[bool, str]] | None = None,
) -> list[str]:
    """Problems with one task built outside a file (messages without file:line; [] when fine).

    ``spec.cwd`` should already be absolute; a relative one is taken from the current folder.
    """
    problems: list[str] = []
    checks = _Checks(known_coders, coder_available)
    for key in ("name", "cwd"):
        msg = _check_value(key, getattr(spec, key))
        if msg:
            problems.append(msg)
    if spec.name in existing_names:
        problems.append(f"name already queued: {spec.name!r} (pick another --name)")
    if not spec.prompt.strip() and _needs_prompt(spec.coder, spec.command):
        problems.append("the prompt is empty (or use coder shell with a command)")
    for key in ("timeout_min", "stall_min", "budget_usd"):
        val = getattr(spec, key)
        if val is not None and (not _is_num(val) or val <= 0):
            problems.append(f"{key} must be greater than 0, got {val}")
    if spec.max_retries is not None and (not _is_int(spec.max_retries) or spec.max_retries < 0):
        problems.append(f"max_retries must be a whole number >= 0, got {spec.max_retries}")
    if spec.merge not in ("manual", "auto"):
        problems.append(f'merge must be "manual" or "auto", got {spec.merge!r}')
    for coder in [spec.coder, *(v.coder for v in spec.verify)]:
        if coder is not None:
            msg = checks.coder(coder)
            if msg and msg not in problems:
                problems.append(msg)
    for dep in spec.depends_on:
        if dep not in existing_names:
            problems.append(
                f"depends_on {dep!r}: no such task in the queue{did_you_mean(dep, existing_names)}"
            )
        elif dep == spec.name:
            problems.append(f"{spec.name!r} cannot depend on itself")
    for ver in spec.verify:
        if ver.kind == "run" and not (ver.run or "").strip():
            problems.append("a run verifier needs a command")
        if ver.kind == "agent" and not (ver.agent or "").strip():
            problems.append("an agent verifier needs review instructions")
        if ver.kind == "artifact" and not (ver.path or "").strip():
            problems.append("an artifact check needs a path")
    cwd = Path(spec.cwd).expanduser().resolve()
    if not cwd.is_dir():
        problems.append(
            f"cwd {spec.cwd!r} does not exist ({cwd})"
            if not cwd.exists()
            else f"cwd {spec.cwd!r} is not a folder"
        )
    elif spec.git_ref:
        msg = checks.git_ref(str(cwd), spec.git_ref)
        if msg:
            problems.append(msg)
    return problems
