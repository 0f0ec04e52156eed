"""Merging finished work: the one merge service of the engine, the attached view and the CLI.

A done task's branch goes into its base (``git/merge.py`` does the git side without touching the
user's checkout), or is pushed as a pull request (``merge = "pr"``, github/pullrequest.py). A
conflict parks the task (``merge_conflict: FILES``); a merge is recorded on the task (``merged
SHA``). After a task reaches ``done`` its worktree's leftovers are committed and an auto-merge
runs when asked (``after_done``). Every move goes through the given ``Lifecycle``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio

from fleet_tui.scheduler import lifecycle as lc
from fleet_tui.scheduler.api import CommandResult
from fleet_tui.scheduler.attempts.launch import load_worktree
from fleet_tui.scheduler.git import worktree as wt
from fleet_tui.scheduler.git.merge import merge_branch
from fleet_tui.scheduler.github.pullrequest import publish
from fleet_tui.scheduler.lifecycle import Lifecycle
from fleet_tui.scheduler.model import Task
from fleet_tui.scheduler.states import TaskStatus


def commit_leftovers(home: Path, task: Task) -> str | None:
    """WIP-commit whatever the attempt left uncommitted in the task's worktree (sha or None)."""
    info = load_worktree(home, task.id)
    if info is None or not info.path.exists():
        return None
    return wt.wip_commit(
        info.path, f"fleet-tui: WIP of {task.name} (attempt {task.attempt}, uncommitted work)"
    )


class Merger:
    """Merges tasks of one fleet home; ``notice`` hears what went wrong in the after-work (it is
    called from a worker thread: give one that may be)."""

    def __init__(
        self,
        life: Lifecycle,
        home: Path,
        keep_worktrees: Callable[[], bool],
        notice: Callable[[str], None] | None = None,
    ) -> None:
        self.life = life
        self.home = Path(home)
        self._keep_worktrees = keep_worktrees
        self._notice = notice or (lambda text: None)

    async def merge(self, ref: str) -> CommandResult:
        """``fleet-tui merge``: a done task (or one parked on a merge that failed) merges now."""
        task = await anyio.to_thread.run_sync(self.life.store.get_task, ref)
        if task is None:
            return CommandResult(False, f"no task {ref!r}")
        why = lc.Reason.of(task)
        if task.status != TaskStatus.DONE and not (
            task.status == TaskStatus.NEEDS_HUMAN and why is not None and why.code in lc.MERGE_TROUBLE
        ):
            return CommandResult(False, f"{task.name} is {task.status.value}: only done tasks merge")
        info = load_worktree(self.home, task.id)
        if info is None:
            return CommandResult(
                False, f"{task.name} ran without git_ref (in place): there is no branch to merge"
            )
        if task.spec.merge == "pr":  # merge = "pr": (re)push and open/update the pull request
            return await anyio.to_thread.run_sync(lambda: publish(self.life, task, info))
        return await anyio.to_thread.run_sync(lambda: self.merge_now(task, info))

    def after_done(self, task: Task) -> None:
        """After a task reached ``done``: commit what is left in its worktree; auto-merge if asked.

        The worktree itself stays (the user inspects or merges it); a merge removes it when clean,
        and the start-up sweep removes clean worktrees of finished tasks. Never raises (blocking):
        a git failure becomes a notice (and, for an auto-merge that was refused, the task's reason)
        instead of an exception.
        """
        info = load_worktree(self.home, task.id)
        if info is None:
            return
        try:
            if info.path.exists():
                wt.wip_commit(info.path, f"fleet-tui: work of {task.name} (attempt {task.attempt})")
            if task.spec.merge == "pr":  # push + pull request (pullrequest.py); failures park the task
                publish(self.life, task, info)
                return
            if task.spec.merge != "auto":
                return
            res = self.merge_now(task, info)
        except Exception as e:  # a broken repository must not take the engine down
            self._notice(f"{task.name}: after-work failed: {e}")
            return
        if res.ok or res.task is None or res.task.status != TaskStatus.DONE:
            return
        # refused (dirty base, base not a branch, ...): stay done, say why it was not merged
        self.life.apply(
            task, lc.auto_merge_refused(res.message.removeprefix(task.name + ": ")), expect=[TaskStatus.DONE]
        )
        self._notice(f"auto-merge of {res.message}")

    def merge_now(self, task: Task, info: wt.WorktreeInfo) -> CommandResult:
        """Merge the task's branch into its base (blocking); park on a conflict; record the commit.

        Leftovers are committed first so the merge brings everything. On success the clean
        worktree is removed (unless ``keep_worktrees``); the branch stays.
        """
        try:
            if info.path.exists():
                wt.wip_commit(info.path, f"fleet-tui: work of {task.name}")
        except wt.WorktreeError as e:
            return CommandResult(False, f"{task.name}: cannot commit the worktree's leftovers: {e}", task)
        try:
            blocks = wt.conflict_blocks(info)
        except wt.WorktreeError as e:
            return CommandResult(False, f"{task.name}: cannot look for conflict markers: {e}", task)
        if blocks:  # an approved task, say, whose agent left a merge unresolved
            return CommandResult(
                False,
                f"{task.name}: its branch adds {wt.CONFLICT_MARKERS} in "
                f"{', '.join(blocks)}: not merging them into {info.base_ref}; resolve them on "
                f"{info.branch} first",
                task,
            )
        res = merge_branch(info, message=f"Merge {info.branch} (fleet-tui task {task.name})")
        if not res.ok:
            if res.conflicts:
                why = f"{task.name}: merge conflict in {', '.join(res.conflicts)}"
                if task.status != TaskStatus.DONE:  # still parked on an earlier conflict
                    return CommandResult(False, why, task)
                new = self.life.apply(task, lc.merge_conflict(res.conflicts), expect=[TaskStatus.DONE])
                return CommandResult(False, why, new)
            return CommandResult(False, f"{task.name}: {res.message}", task)
        new = self.life.apply(
            task, lc.mark_merged(res.commit), expect=[TaskStatus.DONE, TaskStatus.NEEDS_HUMAN]
        )
        msg = f"{task.name}: merged into {info.base_ref} ({(res.commit or '')[:10]})"
        if not self._keep_worktrees() and info.path.exists():
            try:
                if not wt.remove_worktree(info):
                    msg += f"; worktree {info.path} kept (it has uncommitted work)"
            except wt.WorktreeError as e:
                msg += f"; worktree {info.path} not removed: {e}"
        return CommandResult(True, msg, new)
