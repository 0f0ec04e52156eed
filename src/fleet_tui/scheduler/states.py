"""Task states and the one table of allowed transitions.

Kept apart from everything else (Supervisor-style) so the whole life of a task can be read on one
screen, and so the store can refuse an illegal transition in the same transaction that would
write it.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any


class TaskStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    VERIFYING = "verifying"
    DONE = "done"
    NEEDS_HUMAN = "needs_human"
    PAUSED = "paused"
    CANCELLED = "cancelled"


Q, R, V, D, H, P, C = (
    TaskStatus.QUEUED,
    TaskStatus.RUNNING,
    TaskStatus.VERIFYING,
    TaskStatus.DONE,
    TaskStatus.NEEDS_HUMAN,
    TaskStatus.PAUSED,
    TaskStatus.CANCELLED,
)

#: from-state -> the states it may move to.  ``running -> running`` is an adoption or a
#: re-claim after a crash (a new owner and/or attempt), recorded like any other transition.
ALLOWED: dict[TaskStatus, frozenset[TaskStatus]] = {
    Q: frozenset({R, P, C, H}),  # H: dependency_failed / never_started / over budget
    R: frozenset({R, V, D, Q, H, P, C}),  # Q: retry, rate limit, handoff, lost lease
    V: frozenset({D, Q, H, C}),
    P: frozenset({Q, R, C, H}),  # R: resume of a paused running agent (SIGCONT)
    H: frozenset({Q, C, D, H}),  # Q: retry by the user; D: merge resolved / approved; H: takeover
    D: frozenset({H, D, Q}),  # H: merge_conflict on a done task; D->D: merge recorded; Q: follow-up
    C: frozenset({Q}),  # retry of a cancelled task
}

TERMINAL: frozenset[TaskStatus] = frozenset({D, C})
ACTIVE: frozenset[TaskStatus] = frozenset({R, V})
#: states whose dependents may not proceed (they cascade to dependency_failed)
PARKED: frozenset[TaskStatus] = frozenset({H, C})


#: entering these marks the task finished (``finished_at``); moving between them (a merge, a
#: merge conflict) keeps the first finish time
FINISHED: frozenset[TaskStatus] = frozenset({D, C, H})
#: entering these lets go of the claim (owner and lease)
RELEASED: frozenset[TaskStatus] = frozenset({Q, D, C, H})


def entry_fields(
    src: TaskStatus,
    dst: TaskStatus,
    *,
    now: float,
    finished_at: float | None,
    fields: Mapping[str, Any],
) -> dict[str, Any]:
    """What entering ``dst`` from ``src`` writes besides ``status``, ``reason`` and ``updated_at``:
    the caller's ``fields`` plus the state's entry effects (defined here once, for every store).

    Entering a finished state stamps ``finished_at`` (kept when moving between finished states),
    entering a released state clears the claim (owner, lease), and any state but ``queued``
    clears the gate's ``waiting`` note; a field the caller gives wins over each of these."""
    sets = dict(fields)
    if dst in FINISHED and "finished_at" not in fields and (finished_at is None or src not in FINISHED):
        sets["finished_at"] = now
    if dst in RELEASED and "owner" not in fields:
        sets["owner"] = None
        sets["lease_until"] = None
    if dst != Q:
        sets.setdefault("waiting", None)
    return sets


def allowed(src: TaskStatus, dst: TaskStatus) -> bool:
    return dst in ALLOWED[src]


def path_of(
    src: TaskStatus,
    dst: TaskStatus,
    via: TaskStatus | None,
    reason: str | None,
    *,
    now: float,
    finished_at: float | None,
    fields: Mapping[str, Any],
) -> tuple[list[tuple[TaskStatus, TaskStatus, str | None]], dict[str, Any]]:
    """A move from ``src`` to ``dst``, through ``via`` when given: its transition rows
    (``(from, to, reason)``, the reason on the last; each step checked against the table,
    IllegalTransition otherwise) and what it writes besides ``status``, ``reason`` and
    ``updated_at`` (each step's entry effects, the last winning; the caller's ``fields`` last)."""
    steps = [(src, dst)] if via is None else [(src, via), (via, dst)]
    for a, b in steps:
        if not allowed(a, b):
            raise IllegalTransition(a, b)
    rows: list[tuple[TaskStatus, TaskStatus, str | None]] = []
    sets: dict[str, Any] = {}
    for i, (a, b) in enumerate(steps):
        last = i == len(steps) - 1
        stamped = sets.get("finished_at", finished_at)
        sets.update(entry_fields(a, b, now=now, finished_at=stamped, fields=fields if last else {}))
        rows.append((a, b, reason if last else None))
    return rows, sets


class IllegalTransition(ValueError):
    def __init__(self, src: TaskStatus, dst: TaskStatus) -> None:
        super().__init__(f"illegal transition {src.value} -> {dst.value}")
        self.src = src
        self.dst = dst
