"""What an engine holds for one live attempt, and the commands that act on such an agent.

Kept apart so the reaper (finish.py), the adopter and the engine's loops share one small type
instead of importing each other: a ``Running`` is the task as last seen, its runner (the shim's
pipe), its attempt directory and account; ``command_agent`` stops or signals it for a user.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from pathlib import Path

import anyio

from fleet_tui.scheduler import lifecycle as lc
from fleet_tui.scheduler.api import CommandResult
from fleet_tui.scheduler.humans import inbox
from fleet_tui.scheduler.lifecycle import Lifecycle, Move, StopReason
from fleet_tui.scheduler.model import Task
from fleet_tui.scheduler.procs.runner import AttemptRunner
from fleet_tui.scheduler.store.protocol import Store


class Running:
    """What the engine holds for one live attempt."""

    def __init__(
        self, task: Task, runner: AttemptRunner, attempt_dir: Path, coder: str, account: str
    ) -> None:
        self.account = account
        self.task = task
        self.runner = runner
        self.dir = attempt_dir
        self.coder = coder
        self.done = anyio.Event()
        self.peak_mem = 0
        self.metrics_at = 0.0
        #: what the task's earlier attempts spent: budgets and usage cover the whole task
        self.base_cost = 0.0
        self.base_tokens = 0
        #: the agent ended and its verifiers run (finish.py)
        self.verifying = False
        #: the agent ended and nothing it needs holds its slot any more (no verifiers to run):
        #: the engine may start the next agent while this attempt's verdict is written
        self.released = False


#: the user's verbs that stop an agent, and the stop reason each gives its runner
STOPS = {"kill": StopReason.KILLED_BY_USER, "cancel": StopReason.CANCELLED, "retry": StopReason.RETRY_BY_USER}


async def command_agent(
    runners: Mapping[str, Running], verb: str, tid: str, store: Store, life: Lifecycle, grace_s: float
) -> CommandResult:
    """Act on an agent held in ``runners``: stop it (kill, cancel, retry: the reaper then moves
    the task) or signal its group (pause, resume: moved here, fenced by the claim)."""
    r = runners.get(tid)
    if r is None:
        task = await anyio.to_thread.run_sync(store.get_task, tid)
        return CommandResult(False, f"{task.name if task else tid} is not running here")
    name = r.task.name
    if verb in STOPS:
        # a person stopped it: its open questions are cancelled first, before its agent (and the
        # ask_human server it started) hears of the stop and gives up waiting, which would mark
        # a question expired as if nobody had answered in time
        await anyio.to_thread.run_sync(inbox.cancel_for_task, store, tid, life.clock())
        r.runner.stop(STOPS[verb])
        with anyio.move_on_after(grace_s + 10):
            await r.done.wait()
        new = await anyio.to_thread.run_sync(store.get_task, tid)
        state = new.status.value if new else "gone"
        return CommandResult(r.done.is_set(), f"{name}: {verb} -> {state}", new)
    if verb == "pause":
        if not r.runner.signal_agent(signal.SIGSTOP):
            return CommandResult(False, f"{name}: its agent is not running")
        return await _move_live(life, r, lc.pause_live(), f"{name}: paused (agent stopped with SIGSTOP)")
    if verb == "resume":
        r.runner.signal_agent(signal.SIGCONT)
        return await _move_live(life, r, lc.resume_live(), f"{name}: resumed")
    return CommandResult(False, f"unknown command {verb!r}")


async def _move_live(life: Lifecycle, r: Running, move: Move, message: str) -> CommandResult:
    """The fenced move of a task whose agent is held here (pause/resume)."""
    new = await anyio.to_thread.run_sync(lambda: life.apply(r.task, move, held=True))
    if new:
        r.task = new
    return CommandResult(new is not None, message, new)
