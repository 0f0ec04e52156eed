"""Validation of the new-task form: field strings in, a TaskSpec or per-field errors out.

The form screen only collects strings and shows the errors next to its fields; every rule lives
here so it can be tested without a terminal, and so parsing never runs in a widget. Every task key
of the task file can be set (DESIGN section 8): the everyday ones up front, the rest (retries,
timeouts, budget, merge, env, setup, requires, a reviewer, an artifact check) in an advanced
section. When the task file module offers ``validate_spec`` (shared rules with ``fleet-tui
validate``) its problems are added too.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet_tui.scheduler.model import TaskSpec, VerifySpec

NAME_RE = re.compile(r"^[a-z0-9_-]+$")

#: the form's fields in display order: (key, label, placeholder); ``ADVANCED`` ones are folded away
FIELDS: tuple[tuple[str, str, str], ...] = (
    ("prompt", "Prompt", "what the agent should do"),
    ("name", "Name", "unique, a-z 0-9 - _"),
    ("cwd", "Directory", "where it runs (default: .)"),
    ("coder", "Coder", "claude, codex, opencode, gemini, shell, sim (default: config)"),
    ("command", "Command", "shell coder: the command to run (the prompt is in $FLEET_PROMPT)"),
    ("model", "Model", "e.g. sonnet (optional)"),
    ("git_ref", "Git ref", "run in a worktree from this ref (optional)"),
    ("verify", "Verify", "shell command that must pass (optional)"),
    ("priority", "Priority", "integer, higher first (default 0)"),
    ("depends_on", "After", "task names, comma separated (optional)"),
    ("max_retries", "Retries", "how many retries (default: config)"),
    ("timeout_min", "Timeout", "minutes of wall clock per attempt"),
    ("stall_min", "Stall", "minutes without output before it counts as stalled"),
    ("budget_usd", "Budget $", "dollars for the whole task"),
    ("merge", "Merge", "manual (default) or auto"),
    ("env", "Env", "KEY=VALUE pairs, space separated (quote values with spaces)"),
    ("setup", "Setup", "command run in a new worktree before the agent"),
    ("requires", "Requires", "host tags, comma separated"),
    ("review", "Reviewer", "an agent reviewer's instructions (PASS/FAIL verdict)"),
    ("review_model", "Rev. model", "the reviewer's model (optional)"),
    ("artifact", "Artifact", "a file the task must produce (path)"),
    ("artifact_min_chars", "Min chars", "the artifact's least size in characters"),
    ("artifact_contains", "Contains", "strings the artifact must contain, comma separated"),
)
ADVANCED: frozenset[str] = frozenset(k for k, _, _ in FIELDS[10:])
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class FormResult:
    spec: TaskSpec | None
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.spec is not None and not self.errors


def _shared_validator() -> Callable[..., object] | None:
    try:
        from fleet_tui import taskfile  # written by another engineer; optional here
    except Exception:
        return None
    fn = getattr(taskfile, "validate_spec", None)
    return fn if callable(fn) else None


def validate_new_task(
    values: Mapping[str, str],
    existing_names: Collection[str],
    *,
    base_dir: str | None = None,
    is_dir: Callable[[str], bool] = os.path.isdir,
) -> FormResult:
    """Check the form; on success return the TaskSpec to send to ``engine.add``."""
    errors: dict[str, str] = {}
    get = {k: (values.get(k) or "").strip() for k, _, _ in FIELDS}

    prompt = get["prompt"]
    if not prompt:
        errors["prompt"] = "a prompt is required"

    name = get["name"]
    if not name:
        errors["name"] = "a name is required"
    elif not NAME_RE.match(name):
        errors["name"] = "only a-z, 0-9, - and _"
    elif name in existing_names:
        errors["name"] = f"{name!r} already exists"

    cwd = get["cwd"] or "."
    full_cwd = cwd if os.path.isabs(cwd) or base_dir is None else os.path.join(base_dir, cwd)
    if not is_dir(os.path.expanduser(full_cwd)):
        errors["cwd"] = f"no such directory: {cwd}"
    else:
        cwd = os.path.abspath(os.path.expanduser(full_cwd))

    priority = 0
    if get["priority"]:
        try:
            priority = int(get["priority"])
        except ValueError:
            errors["priority"] = "must be a whole number"

    deps = tuple(d for d in (p.strip() for p in get["depends_on"].replace(" ", ",").split(",")) if d)
    missing = [d for d in deps if d not in existing_names]
    if missing:
        errors["depends_on"] = "unknown: " + ", ".join(missing)
    elif name and name in deps:
        errors["depends_on"] = "a task cannot wait for itself"

    coder = get["coder"] or None
    if coder is not None and not NAME_RE.match(coder):
        errors["coder"] = "not a coder name"
    command = get["command"] or None
    if coder == "shell" and command is None:
        errors["command"] = "the shell coder needs a command"

    max_retries = _number(get, "max_retries", int, errors, low=0)
    timeout_min = _number(get, "timeout_min", float, errors, low=0, strict=True)
    stall_min = _number(get, "stall_min", float, errors, low=0, strict=True)
    budget_usd = _number(get, "budget_usd", float, errors, low=0)
    min_chars = _number(get, "artifact_min_chars", int, errors, low=0)

    merge = (get["merge"] or "manual").lower()
    if merge not in ("manual", "auto"):
        errors["merge"] = "manual or auto"

    env: list[tuple[str, str]] = []
    try:
        for pair in shlex.split(get["env"]):
            key, sep, value = pair.partition("=")
            if not sep or not ENV_KEY.match(key):
                errors["env"] = f"{pair!r} is not KEY=VALUE"
                break
            env.append((key, value))
    except ValueError as exc:
        errors["env"] = f"unbalanced quotes ({exc})"

    requires = _words(get["requires"])
    contains = tuple(c.strip() for c in get["artifact_contains"].split(",") if c.strip())
    if (min_chars or contains) and not get["artifact"]:
        errors["artifact"] = "give the artifact's path"

    if errors:
        return FormResult(None, errors)

    verify: list[VerifySpec] = []
    if get["verify"]:
        verify.append(VerifySpec(kind="run", run=get["verify"]))
    if get["review"]:
        verify.append(VerifySpec(kind="agent", agent=get["review"], model=get["review_model"] or None))
    if get["artifact"]:
        verify.append(
            VerifySpec(kind="artifact", path=get["artifact"], min_chars=min_chars or 0, contains=contains)
        )
    spec = TaskSpec(
        name=name,
        prompt=prompt,
        cwd=cwd,
        coder=coder,
        model=get["model"] or None,
        command=command,
        git_ref=get["git_ref"] or None,
        priority=priority,
        depends_on=deps,
        timeout_min=timeout_min,
        stall_min=stall_min,
        max_retries=max_retries,
        requires=requires,
        verify=tuple(verify),
        budget_usd=budget_usd,
        setup=get["setup"] or None,
        merge="auto" if merge == "auto" else "manual",
        env=tuple(env),
        source="cockpit",
    )
    for problem in shared_problems(spec, existing_names):
        errors.setdefault(field_of(problem), problem)
    return FormResult(None, errors) if errors else FormResult(spec)


def _words(text: str) -> tuple[str, ...]:
    return tuple(w for w in text.replace(",", " ").split() if w)


def _number(
    get: Mapping[str, str],
    key: str,
    kind: type[int] | type[float],
    errors: dict[str, str],
    *,
    low: float,
    strict: bool = False,
) -> Any:
    """``get[key]`` as an int or a finite float at least ``low`` (above it when ``strict``);
    None when empty; an error for the field otherwise."""
    text = get[key]
    if not text:
        return None
    try:
        value = kind(text)
    except ValueError:
        errors[key] = "must be a whole number" if kind is int else "must be a number"
        return None
    if isinstance(value, float) and not math.isfinite(value):
        errors[key] = "must be a finite number"
        return None
    if value < low or (strict and value == low):
        errors[key] = f"must be {'more than' if strict else 'at least'} {low:g}"
        return None
    return value


#: the order in which a shared validator's message is attributed to a field
_FIELD_WORDS: tuple[tuple[str, str], ...] = (
    ("depends_on", "depends_on"),
    ("command", "command"),
    ("timeout_min", "timeout_min"),
    ("stall_min", "stall_min"),
    ("max_retries", "max_retries"),
    ("budget_usd", "budget_usd"),
    ("merge", "merge"),
    ("env", "env"),
    ("setup", "setup"),
    ("requires", "requires"),
    ("artifact", "artifact"),
    ("git_ref", "git_ref"),
    ("cwd", "cwd"),
    ("coder", "coder"),
    ("model", "model"),
    ("priority", "priority"),
    ("verify", "verify"),
    ("name", "name"),
)


def field_of(problem: str) -> str:
    """Which form field a shared validator's message is about (the prompt when unclear)."""
    return next((key for word, key in _FIELD_WORDS if word in problem), "prompt")


def known_coders() -> list[str]:
    """Coder names from the ``fleet_tui.coders`` entry points (metadata only, nothing imported)."""
    from importlib.metadata import entry_points

    return sorted({ep.name for ep in entry_points(group="fleet_tui.coders")})


def shared_problems(spec: TaskSpec, existing_names: Collection[str]) -> list[str]:
    """The task file's own checks (``taskfile.validate_spec``), when that module is available."""
    shared = _shared_validator()
    coders = known_coders()
    if shared is None or not coders:
        return []
    try:
        problems = shared(spec, known_coders=coders, existing_names=existing_names)
    except TypeError:
        return []  # a different signature than expected: our own checks stand
    return _as_messages(problems)


def _as_messages(problems: object) -> list[str]:
    if not problems:
        return []
    if isinstance(problems, str):
        return [problems]
    if isinstance(problems, (list, tuple)):
        return [str(p) for p in problems]
    return []
