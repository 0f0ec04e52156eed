"""Validation of the new-task form: field strings in, a TaskSpec or per-field errors out.

The form screen only collects strings and shows the errors next to its fields; every rule lives
here so it can be tested without a terminal, and so parsing never runs in a widget. When the task
file module offers ``validate_spec`` (shared rules with ``fleet-tui validate``) its problems are
added too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from fleet_tui.scheduler.model import TaskSpec, VerifySpec

NAME_RE = re.compile(r"^[a-z0-9_-]+$")

#: the form's fields in display order: (key, label, placeholder)
FIELDS: tuple[tuple[str, str, str], ...] = (
    ("prompt", "Prompt", "what the agent should do"),
    ("name", "Name", "unique, a-z 0-9 - _"),
    ("cwd", "Directory", "where it runs (default: .)"),
    ("coder", "Coder", "claude, codex, opencode, gemini, shell, sim (default: config)"),
    ("model", "Model", "e.g. sonnet (optional)"),
    ("git_ref", "Git ref", "run in a worktree from this ref (optional)"),
    ("verify", "Verify", "shell command that must pass (optional)"),
    ("priority", "Priority", "integer, higher first (default 0)"),
    ("depends_on", "After", "task names, comma separated (optional)"),
)


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

    if errors:
        return FormResult(None, errors)

    verify = (VerifySpec(kind="run", run=get["verify"]),) if get["verify"] else ()
    spec = TaskSpec(
        name=name,
        prompt=prompt,
        cwd=cwd,
        coder=coder,
        model=get["model"] or None,
        git_ref=get["git_ref"] or None,
        priority=priority,
        depends_on=deps,
        verify=verify,
        source="cockpit",
    )
    for problem in shared_problems(spec, existing_names):
        errors.setdefault(field_of(problem), problem)
    return FormResult(None, errors) if errors else FormResult(spec)


#: the order in which a shared validator's message is attributed to a field
_FIELD_WORDS: tuple[tuple[str, str], ...] = (
    ("depends_on", "depends_on"),
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
