"""One definition of a task's times, shared by ``status``, ``status --json`` and the cockpit.

They used to compute "elapsed" two ways and disagree. A task's ``elapsed`` is the running time of
its current attempt while it runs or verifies, else of its last attempt (from its start to its
end). Time in the queue — a retry's backoff, a rate-limit reset, waiting for a dependency — and
time parked or paused never counts. ``work_s`` (``status --json``) adds up every attempt.
"""

from __future__ import annotations

from collections.abc import Iterable

from fleet_tui.scheduler.model import Attempt, Task


def attempt_end(task: Task) -> float | None:
    """When the task's last attempt ended (None while it runs or before its first attempt)."""
    return task.attempt_end()


def elapsed(task: Task, now: float) -> float | None:
    """Seconds of the current attempt (running/verifying) or of the last one; None before any."""
    return task.elapsed(now)


def work_s(attempts: Iterable[Attempt], now: float) -> float:
    """Seconds agents worked on the task: every attempt from its start to its end (or now)."""
    return sum(max(0.0, (a.ended_at if a.ended_at is not None else now) - a.started_at) for a in attempts)
