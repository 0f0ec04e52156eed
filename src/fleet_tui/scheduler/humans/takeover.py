"""Taking over a task by hand: stop its headless agent, park it under the person's name, settle it.

Why: sometimes the fastest way forward is to drive the agent yourself, in its own conversation
and its own worktree (claude-squad and agent-deck users attach to the agent's session). The
headless agent is stopped first (its WIP committed to the branch, as on any stop), and the task
is parked as ``needs_human`` with the reason ``taken over by <user>``: the engine never claims a
parked task, and dependents wait. When the person is done, they choose what happens next:
verify now, requeue (the agent continues its conversation, told that a person worked on it),
mark done (an approval), or leave it parked. The terminal side (tmux window, foreground
process, the question) lives in the CLI; this module only changes the store.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio

from fleet_tui.coders.base import CannotResume, get_coder
from fleet_tui.scheduler import lifecycle as lc
from fleet_tui.scheduler.api import CommandResult
from fleet_tui.scheduler.humans import followup, settle
from fleet_tui.scheduler.lifecycle import Commands
from fleet_tui.scheduler.model import Task
from fleet_tui.scheduler.states import ACTIVE, TaskStatus
from fleet_tui.scheduler.store.protocol import Store

CHOICES = ("verify", "requeue", "done", "leave")
REQUEUE_NOTE = (
    "{by} took this task over and worked on it interactively in this working directory. Look at "
    "what changed (git status, git log, git diff), then finish the task."
)


@dataclass(frozen=True)
class VerifyVerdict:
    passed: bool
    label: str | None
    output: str


def is_taken_over(task: Task) -> bool:
    why = lc.Reason.of(task)
    return task.status == TaskStatus.NEEDS_HUMAN and why is not None and why.code == lc.ReasonCode.TAKEN_OVER


async def begin(ctl: Commands, ref: str, by: str) -> CommandResult:
    """Stop the task's agent if it runs (WIP kept) and park the task as taken over by ``by``."""
    task = await ctl.get(ref)
    if isinstance(task, CommandResult):
        return task
    if is_taken_over(task):
        if lc.Reason.of(task) == lc.Reason(
            lc.ReasonCode.TAKEN_OVER, by
        ):  # the same person again (a window closed by accident)
            return CommandResult(True, f"{task.name}: {task.reason}", task)
        return CommandResult(False, f"{task.name} is already {task.reason}")
    if task.status == TaskStatus.CANCELLED:
        return CommandResult(False, f"{task.name} is cancelled: retry it first")
    if task.status in ACTIVE or (task.status == TaskStatus.PAUSED and task.paused_running):
        stopped: CommandResult = await ctl.kill(ref)
        if not stopped.ok:
            return stopped
        task = await ctl.get(ref)
        if isinstance(task, CommandResult):
            return task
    return await ctl.command(task, lc.take_over(by))


def session(store: Store, home: Path, task: Task) -> tuple[str | None, Path]:
    """The latest session id the task's attempts recorded, and the directory of that attempt."""
    attempts = store.attempts(task.id)
    for a in reversed(attempts):
        sid = followup.session_of(store, task.id, a.n)
        if sid:
            return sid, Path(a.dir)
    if attempts:
        return None, Path(attempts[-1].dir)
    return None, home / "tasks" / task.id / "attempts" / "1"


@dataclass(frozen=True)
class Interactive:
    argv: list[str]
    env: dict[str, str]  # added to the person's environment
    workdir: str
    note: str | None = None  # why it is a plain shell instead of the CLI's session


def interactive_command(store: Store, home: Path, default_coder: str, task: Task) -> Interactive:
    """The CLI's own interactive session on the task's conversation, in its worktree (or the
    person's shell there, saying why, when the coder has none)."""
    workdir = task.workdir or task.worktree or task.spec.cwd
    sid, adir = session(store, home, task)
    coder = get_coder(task.coder or default_coder)
    try:
        interactive = getattr(coder, "interactive_argv", None)
        if interactive is None:
            raise CannotResume(f"the {coder.name} coder has no interactive session to open")
        argv, extra = interactive(sid, adir)
    except CannotResume as e:
        shell = os.environ.get("SHELL") or "/bin/sh"
        return Interactive([shell], {}, workdir, f"{e}; opening a shell in the worktree instead")
    return Interactive(list(argv), dict(extra), workdir)


def open_tmux_window(it: Interactive, title: str) -> str | None:
    """The session in a new tmux window (we are inside tmux); returns once that window has
    closed, or the error when tmux refused."""
    env_flags = [x for k, v in it.env.items() for x in ("-e", f"{k}={v}")]
    cmd = ["tmux", "new-window", "-P", "-F", "#{pane_id}", "-n", title, "-c", it.workdir, *env_flags]
    out = subprocess.run([*cmd, shlex.join(it.argv)], capture_output=True, text=True)
    if out.returncode != 0:
        return f"tmux new-window failed: {out.stderr.strip()}"
    pane = out.stdout.strip()
    while True:
        panes = subprocess.run(
            ["tmux", "list-panes", "-a", "-F", "#{pane_id}"], capture_output=True, text=True
        )
        if panes.returncode != 0 or pane not in panes.stdout.split():
            return None
        time.sleep(0.3)


async def finish(
    ctl: Commands, ref: str, choice: str, by: str, verify: Callable[[Task], VerifyVerdict] | None = None
) -> CommandResult:
    """Settle a taken-over task the way the person chose (one of CHOICES)."""
    task = await ctl.get(ref)
    if isinstance(task, CommandResult):
        return task
    if not is_taken_over(task):
        return CommandResult(False, f"{task.name} is {task.status.value} ({task.reason}), not taken over")
    if choice == "leave":
        return await ctl.command(task, lc.leave_after_takeover(by))
    if choice == "done":
        res: CommandResult = await settle.approve(ctl, ref, by)
        return res
    if choice == "requeue":
        note = REQUEUE_NOTE.format(by=by)
        await anyio.to_thread.run_sync(followup.add_pending, ctl.store, task.id, note, by, ctl.clock())
        return await ctl.command(task, lc.requeue_after_takeover(by))
    if choice == "verify":
        if verify is None:
            return CommandResult(False, "verify: no verifier runner given")
        v = await anyio.to_thread.run_sync(verify, task)
        if v.passed:
            return await ctl.command(task, lc.verified_after_takeover(by))
        parked = await ctl.command(task, lc.verify_failed_after_takeover(v.label, by))
        tail = v.output.strip()[-1500:]
        return CommandResult(False, f"{task.name}: verify failed: {v.label}\n{tail}".rstrip(), parked.task)
    return CommandResult(False, f"unknown choice {choice!r}: one of {', '.join(CHOICES)}")
