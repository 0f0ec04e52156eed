"""User commands on tasks that this process does not run: the CLI, an attached cockpit, an engine
acting on another engine's task.

A task that is not running is changed directly in the store (one fenced transition). A running
task belongs to the engine that claimed it: the command is queued in the store's ``commands``
table for that engine, which acts (it holds the agent) and records the result; the caller waits
for that result. When the owner is gone (its heartbeat stopped) and ran on this machine, the
controller stops the shim itself so nothing waits on a dead engine.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio

from fleet_tui.scheduler import lifecycle as lc
from fleet_tui.scheduler.api import CommandResult
from fleet_tui.scheduler.lifecycle import Lifecycle, Move
from fleet_tui.scheduler.model import Attempt, Event, Task, TaskSpec, Transition
from fleet_tui.scheduler.procs import shim as shimmod
from fleet_tui.scheduler.procs.attemptdir import ShimInfo, read_shim
from fleet_tui.scheduler.states import ACTIVE, PARKED, IllegalTransition, TaskStatus
from fleet_tui.scheduler.store.changes import changed
from fleet_tui.scheduler.store.protocol import Store, StoreError
from fleet_tui.scheduler.store.storeclock import StoreClock

RUNNING_LIKE = frozenset({TaskStatus.RUNNING, TaskStatus.VERIFYING})


@dataclass(frozen=True)
class ControlConfig:
    """The engines' heartbeat period (a controller judges an engine alive by it) and how long a
    controller waits for an engine to carry out a command."""

    heartbeat_s: float = 5.0
    command_timeout_s: float = 30.0


#: the names a command's answer lists (``load`` of a 3,000-task file printed every one on one line)
SHOWN_NAMES = 20


def owner_alive(store: Store, owner: str | None, now: float, stale_s: float) -> bool:
    """True when the engine ``owner`` heartbeats and (on this host) its process still lives."""
    if not owner:
        return False
    info = store.engine_info(owner)
    if info is None or info.get("stopped"):
        return False
    if info["host"] == socket.gethostname() and not shimmod.alive(
        int(info["pid"]), int(info["pid_create_time"])
    ):
        return False
    return bool(info["heartbeat"] >= now - stale_s)


class Controller:
    """Store-level commands; the Engine extends it with actions on the agents it runs."""

    #: the fleet home, where worktree records live (None for a bare CLI controller)
    home: Path | None = None

    def __init__(
        self,
        store: Store,
        *,
        actor: str = "cli",
        clock: Callable[[], float] = time.time,
        cfg: ControlConfig | None = None,
        publish: Callable[[Task], None] | None = None,
    ) -> None:
        self.store = store
        self.actor = actor
        # the real clock means the store's (PostgreSQL's server clock: storeclock.py); a clock
        # given by a caller (a test's) is used as it is
        self.clock = StoreClock(store) if clock is time.time else clock
        self.ccfg = cfg or ControlConfig()
        #: every change of a task's state made here (lifecycle.py)
        self.life = Lifecycle(store, self.clock, actor, publish)

    def wake(self) -> None:
        """Nothing schedules here; the engine wakes its scheduler."""

    # -- helpers ------------------------------------------------------------------------------
    async def _t(self, fn: Callable[..., object], *args: object, **kw: object) -> object:
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kw))

    def find(self, ref: str) -> Task | None:
        return self.store.get_task(ref)

    def _stale_s(self) -> float:
        return max(3 * self.ccfg.heartbeat_s, 5.0)

    async def _remote(self, task: Task, verb: str, arg: str | None = None) -> CommandResult | None:
        """Queue ``verb`` for the task's owning engine and wait for its result; None when the owner
        is not alive (the caller then acts directly)."""
        now = self.clock()
        alive = await anyio.to_thread.run_sync(owner_alive, self.store, task.owner, now, self._stale_s())
        if not alive:
            return None
        token = await anyio.to_thread.run_sync(self.store.change_token)
        cid = int(await anyio.to_thread.run_sync(self.store.add_command, task.id, verb, arg, task.owner, now))
        deadline = time.monotonic() + self.ccfg.command_timeout_s
        while time.monotonic() < deadline:
            cmd = await anyio.to_thread.run_sync(self.store.get_command, cid)
            if cmd is not None and cmd.status != "pending":
                fresh = await anyio.to_thread.run_sync(self.store.get_task, task.id)
                return CommandResult(cmd.status == "done", cmd.result or verb, fresh)
            # the engine's answer is its commit: the store's change token wakes us at once
            left = max(0.0, min(1.0, deadline - time.monotonic()))
            token = await changed(self.store, token, left)
        return CommandResult(
            False,
            f"{verb}: the engine owning {task.name} ({task.owner}) did not answer "
            f"within {self.ccfg.command_timeout_s:g}s; is it stuck? `fleet-tui hosts`",
        )

    async def stop_for_followup(self, task: Task) -> CommandResult | None:
        """Ask the engine owning ``task`` to stop its agent at the next turn boundary (None when
        no live engine owns it)."""
        return await self._remote(task, "followup")

    def _stop_local_shim(self, task: Task) -> None:
        """Stop the agent of a task whose engine is gone, when its shim runs on this machine."""
        att = self.store.get_attempt(task.id, task.attempt)
        if att is None or not att.dir:
            return
        info = _read_shim(Path(att.dir))
        if info and shimmod.alive(info.pid, info.start_ticks):
            try:
                os.kill(info.pid, signal.SIGTERM)
            except OSError:
                pass

    async def command(self, task: Task, move: Move) -> CommandResult:
        """Apply a user's move to a task no engine holds (fenced by the state it was seen in)."""
        try:
            new = await anyio.to_thread.run_sync(lambda: self.life.apply(task, move))
        except IllegalTransition as e:
            return CommandResult(
                False, f"{task.name} is {task.status.value}: cannot move it to {move.dst.value} ({e})"
            )
        except StoreError as e:
            return CommandResult(False, str(e))
        if new is None:
            return CommandResult(False, f"{task.name} changed meanwhile; look again (`fleet-tui status`)")
        why = f" ({move.reason.text})" if move.reason is not None else ""
        return CommandResult(True, f"{task.name}: {move.dst.value}{why}", new)

    async def get(self, ref: str) -> Task | CommandResult:
        """The task named (or with the id) ``ref``, else a failed result that says so."""
        task = await anyio.to_thread.run_sync(self.find, ref)
        if task is None:
            names = await anyio.to_thread.run_sync(self.store.task_names)
            return CommandResult(False, no_task_message(ref, names))
        return task

    async def _on_running(self, task: Task, verb: str) -> CommandResult | None:
        """Route a command on a running task to its engine; when the engine is dead, stop the
        agent here and return None so the caller changes the store directly."""
        if task.status in ACTIVE or (task.status == TaskStatus.PAUSED and task.paused_running):
            res = await self._remote(task, verb)
            if res is not None:
                return res
            await anyio.to_thread.run_sync(self._stop_local_shim, task)
        return None

    # -- commands -----------------------------------------------------------------------------
    async def add(self, specs: Sequence[TaskSpec]) -> CommandResult:
        try:
            tasks = await anyio.to_thread.run_sync(self.store.add_tasks, list(specs), self.clock())
        except StoreError as e:
            return CommandResult(False, str(e))
        shown = ", ".join(t.name for t in tasks[:SHOWN_NAMES])
        more = f" and {len(tasks) - SHOWN_NAMES} more" if len(tasks) > SHOWN_NAMES else ""
        return CommandResult(True, f"queued {len(tasks)}: {shown}{more}", tasks[0] if tasks else None)

    async def kill(self, ref: str) -> CommandResult:
        task = await self.get(ref)
        if isinstance(task, CommandResult):
            return task
        if task.status in (TaskStatus.DONE, TaskStatus.CANCELLED, TaskStatus.NEEDS_HUMAN):
            return CommandResult(False, f"{task.name} is {task.status.value}: nothing to kill")
        res = await self._on_running(task, "kill")
        if res is not None:
            return res
        return await self.command(task, lc.kill())

    async def cancel(self, ref: str) -> CommandResult:
        task = await self.get(ref)
        if isinstance(task, CommandResult):
            return task
        if task.status in (TaskStatus.DONE, TaskStatus.CANCELLED):
            return CommandResult(False, f"{task.name} is {task.status.value}: nothing to cancel")
        res = await self._on_running(task, "cancel")
        if res is not None:
            return res
        return await self.command(task, lc.cancel())

    async def retry(self, ref: str) -> CommandResult:
        task = await self.get(ref)
        if isinstance(task, CommandResult):
            return task
        if task.status == TaskStatus.DONE:
            return CommandResult(False, f"{task.name} is done; add a new task to redo it")
        if task.status == TaskStatus.QUEUED:
            return await self.command(task, lc.retry(queued=True))
        if task.status not in ACTIVE:
            deps = await anyio.to_thread.run_sync(self.store.dependencies, task.id)
            parked = [d for d in deps if d.status in PARKED]
            if parked:  # it would only wait for a parent that waits for a person
                d = parked[0]
                return CommandResult(
                    False,
                    f"cannot retry {task.name}: it depends on {d.name}, which is {d.status.value}"
                    + (f" ({d.reason})" if d.reason else "")
                    + f"; retry {d.name} first (its dependents come back with it)",
                )
        why = lc.Reason.of(task)
        if (
            task.status == TaskStatus.NEEDS_HUMAN
            and why is not None
            and why.code == lc.ReasonCode.MERGE_CONFLICT
        ):
            return await self._resolve_conflict(task, why.detail or "")
        res = await self._on_running(task, "retry")
        if res is not None:
            return res
        return await self.command(task, lc.retry())

    async def _resolve_conflict(self, task: Task, files: str) -> CommandResult:
        """A retry of a task whose merge stopped on a conflict: its agent goes on with its own
        conversation, asked to merge the base into its branch and resolve the conflict (running
        it again as it was would only make the same change, and the same conflict, again)."""
        from fleet_tui.scheduler.humans import followup

        # a task that met a merge conflict ran in its worktree: it has a branch
        base, branch = task.spec.git_ref or "the base branch", task.branch or "its branch"
        res = await followup.send(self, task.id, followup.merge_conflict_turn(base, branch, files))
        if not res.ok:
            return res
        return CommandResult(
            True,
            f"{task.name}: back to its agent, asked to merge {base} into {branch} and resolve {files}",
            res.task,
        )

    async def pause(self, ref: str | None) -> CommandResult:
        if ref is None:
            await anyio.to_thread.run_sync(self.store.set_setting, "fleet_paused", "1")
            return CommandResult(True, "fleet paused: no new agents start (running ones continue)")
        task = await self.get(ref)
        if isinstance(task, CommandResult):
            return task
        if task.status == TaskStatus.PAUSED:
            return CommandResult(False, f"{task.name} is already paused")
        if task.status == TaskStatus.QUEUED:
            return await self.command(task, lc.pause())
        if task.status in ACTIVE:
            res = await self._remote(task, "pause")
            if res is not None:
                return res
            return CommandResult(
                False, f"{task.name}'s engine ({task.owner}) is not running; cannot pause its agent"
            )
        return CommandResult(False, f"{task.name} is {task.status.value}: only queued or running tasks pause")

    async def resume(self, ref: str | None) -> CommandResult:
        if ref is None:
            await anyio.to_thread.run_sync(self.store.set_setting, "fleet_paused", None)
            return CommandResult(True, "fleet resumed")
        task = await self.get(ref)
        if isinstance(task, CommandResult):
            return task
        if task.status != TaskStatus.PAUSED:
            return CommandResult(False, f"{task.name} is {task.status.value}, not paused")
        if task.paused_running:
            res = await self._remote(task, "resume")
            if res is not None:
                return res
            return await self.command(task, lc.resume(engine_gone=True))
        return await self.command(task, lc.resume())

    async def answer(self, question_id: str, text: str) -> CommandResult:
        q = await anyio.to_thread.run_sync(self.store.get_question, question_id)
        if q is None:
            return CommandResult(False, f"no question {question_id!r} (`fleet-tui questions` lists them)")
        if q.status == "pending":
            from fleet_tui.scheduler.humans.inbox import check_answer

            checked, why = check_answer(q, text)
            if checked is None:
                return CommandResult(False, f"{why}; answer with one of them")
            text = checked
        ok = await anyio.to_thread.run_sync(
            self.store.answer_question, question_id, text, self.actor, self.clock()
        )
        if not ok:
            q = await anyio.to_thread.run_sync(self.store.get_question, question_id)
            state = q.status if q else "gone"
            return CommandResult(
                False,
                f"question {question_id} is already {state}"
                + (f" (answer: {q.answer!r})" if q and q.answer else ""),
            )
        return CommandResult(True, f"answered {question_id}")

    # -- reads for the cockpit (shared by the engine and the attached view) ---------------------
    # Each is a plain blocking function of the store (thread-safe: it locks or pools its
    # connections) and one hop to a worker thread. The hosted cockpit calls the blocking ones from
    # its own worker threads (app/hosted.py): a read then never waits for the engine's busy loop
    # to take its answer back, which under a loud fleet was most of a stream fill's time.
    def stored_events(self, ref: str, attempt: int | None = None, limit: int = 2000) -> list[Event]:
        """The task's last ``limit`` events (of one attempt, or of all), oldest first; blocking."""
        task = self.find(ref)
        if task is None:
            return []
        if attempt is None:
            return self.store.last_events(task.id, limit)
        return self.store.events(task.id, attempt, limit=limit)

    def stored_attempts(self, ref: str) -> list[Attempt]:
        task = self.find(ref)
        return [] if task is None else self.store.attempts(task.id)

    def stored_transitions(self, ref: str) -> list[Transition]:
        task = self.find(ref)
        return [] if task is None else self.store.transitions(task.id)

    async def events(self, ref: str, attempt: int | None = None, limit: int = 2000) -> list[Event]:
        return await anyio.to_thread.run_sync(self.stored_events, ref, attempt, limit)

    async def attempts(self, ref: str) -> list[Attempt]:
        return await anyio.to_thread.run_sync(self.stored_attempts, ref)

    async def transitions(self, ref: str) -> list[Transition]:
        return await anyio.to_thread.run_sync(self.stored_transitions, ref)

    async def pull_request(self, ref: str) -> str | None:
        """The task's pull request in one line (``PR #12 open, checks passing · URL``), or None."""
        from fleet_tui.scheduler.github.pullrequest import summary

        task = await anyio.to_thread.run_sync(self.find, ref)
        return None if task is None else await anyio.to_thread.run_sync(summary, self.store, task)

    async def diff(self, ref: str) -> str:
        from fleet_tui.scheduler.attempts.launch import task_diff

        task = await anyio.to_thread.run_sync(self.find, ref)
        if task is None:
            return f"no task {ref!r}"
        if self.home is None:
            return "no fleet home known here: cannot find the task's worktree"
        return await anyio.to_thread.run_sync(task_diff, self.home, task)


#: the store setting that lists archived tasks (JSON list of ids): finished tasks kept out of the
#: views (status, the cockpit) with every record intact; ``status --all`` shows them
ARCHIVED_KEY = "archived_tasks"


def archived_ids(store: Store) -> set[str]:
    import json

    raw = store.get_setting(ARCHIVED_KEY)
    try:
        ids = json.loads(raw) if raw else []
    except ValueError:
        return set()
    return {str(i) for i in ids} if isinstance(ids, list) else set()


def archive(store: Store, tasks: Sequence[Task]) -> None:
    """Keep finished tasks out of the views (their records stay; ids and ``logs`` still work)."""
    import json

    ids = archived_ids(store) | {t.id for t in tasks}
    store.set_setting(ARCHIVED_KEY, json.dumps(sorted(ids)))


def no_task_message(ref: str, names: Iterable[str]) -> str:
    """``no task 'k11'`` with a did-you-mean among the store's task names."""
    import difflib

    close = difflib.get_close_matches(ref, list(names), n=1, cutoff=0.6)
    hint = f" — did you mean {close[0]!r}?" if close else ""
    return f"no task {ref!r}{hint} (give an id or a name; `fleet-tui status` lists them)"


def _read_shim(d: Path) -> ShimInfo | None:
    return read_shim(d)


def hostname() -> str:
    return socket.gethostname()
