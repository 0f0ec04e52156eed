"""Settling tasks by hand: approve a parked task, replace a queued task's spec.

Why: a person who read the diff of a task parked as ``needs_human`` (a verifier too strict, a
false alarm, work finished during a takeover) must be able to call it done without faking a
verifier, and a queued task with a typo in its prompt must be fixable without cancel and re-add.
Approval is a transition with the person as its reason (``approved_by:<user>``), so the record
says who vouched for it instead of which verifier passed.
"""

from __future__ import annotations

import anyio

from fleet_tui.scheduler import lifecycle as lc
from fleet_tui.scheduler.api import CommandResult
from fleet_tui.scheduler.lifecycle import Commands
from fleet_tui.scheduler.model import TaskSpec
from fleet_tui.scheduler.states import TaskStatus


async def approve(ctl: Commands, ref: str, by: str) -> CommandResult:
    """A parked task (needs_human, a takeover's too) becomes done, approved by ``by``; the
    dependents parked because it was parked come back with it (lifecycle.approve)."""
    task = await ctl.get(ref)
    if isinstance(task, CommandResult):
        return task
    if task.status != TaskStatus.NEEDS_HUMAN:
        return CommandResult(
            False,
            f"{task.name} is {task.status.value}: only a parked task (needs_human) can be approved "
            "(`fleet-tui send` asks a finished agent for more; `kill` parks a running one)",
        )
    res = await ctl.command(task, lc.approve(by))
    if not res.ok or res.task is None:
        return res
    note = f"approved by {by} (by hand, in place of the verifiers)"
    await anyio.to_thread.run_sync(
        lambda: ctl.store.update_attempt(task.id, task.attempt, verify_output=note)
    )
    return CommandResult(True, f"{task.name}: done (approved by {by})", res.task)


def check_edit(old: TaskSpec, new: TaskSpec) -> str | None:
    """Why an edited spec cannot replace the queued one (None: it can)."""
    if new.name != old.name:
        return f"the name cannot change in edit ({old.name!r} -> {new.name!r}); add a new task instead"
    if tuple(new.depends_on) != tuple(old.depends_on):
        return "depends_on cannot change in edit; cancel the task and load it again"
    return None
