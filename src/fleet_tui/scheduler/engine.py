"""The engine: claims tasks, spawns their agents under shims, reaps them and decides what's next.

Pure async (anyio), no UI imports. One ``Engine`` per process; several engines (processes or
machines) share one store and never run the same attempt twice: claims are fenced, leases are
heartbeated, and a restarted engine adopts the live shims of its dead predecessor instead of
starting second agents. It wakes on events (a task added, an agent exited, a command) and on the
store's change token (another process committed: store/changes.py); planning is the Planner's
(planner.py), which reads the store only when something changed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup

from fleet_tui import __version__, notify
from fleet_tui.coders.base import account_of
from fleet_tui.config import Config, ConfigError, ConfigWatcher, load_config, set_value
from fleet_tui.scheduler import caps
from fleet_tui.scheduler import lifecycle as lc
from fleet_tui.scheduler.api import CommandResult
from fleet_tui.scheduler.attempts.adopt import Adopter
from fleet_tui.scheduler.attempts.eventwriter import EventWriter
from fleet_tui.scheduler.attempts.finish import Reaper
from fleet_tui.scheduler.attempts.launch import Launch, Launcher, LaunchError
from fleet_tui.scheduler.attempts.ratelimits import RateLimitBook
from fleet_tui.scheduler.attempts.running import Running, command_agent
from fleet_tui.scheduler.attempts.sink import AttemptSink
from fleet_tui.scheduler.bus import Bus
from fleet_tui.scheduler.control import ControlConfig, Controller, hostname
from fleet_tui.scheduler.git import worktree as wt
from fleet_tui.scheduler.git import wtmark
from fleet_tui.scheduler.github import prwatch
from fleet_tui.scheduler.humans.followup import adopted_watch, stop_at_turn
from fleet_tui.scheduler.lifecycle import StopReason
from fleet_tui.scheduler.merger import Merger
from fleet_tui.scheduler.model import (
    EngineEvent,
    Event,
    GaugesChanged,
    Host,
    HostSeries,
    Notice,
    QuestionChanged,
    Snapshot,
    Task,
    TaskChanged,
    TaskSpec,
)
from fleet_tui.scheduler.onloop import LoopPost
from fleet_tui.scheduler.planner import TRANSIENT_GATES, Admission, Plan, Planner, settled
from fleet_tui.scheduler.policy.gate import GateConfig
from fleet_tui.scheduler.policy.headroom import Headroom, MemoryModel, read_headroom, trees_memory
from fleet_tui.scheduler.policy.outcome import Policy
from fleet_tui.scheduler.policy.review import make_reviewer
from fleet_tui.scheduler.policy.verify import AgentReviewer
from fleet_tui.scheduler.procs import shim as shimmod
from fleet_tui.scheduler.procs.owned import reap_stale
from fleet_tui.scheduler.procs.runner import AttemptRunner, RunLimits, ShimPool, write_lease
from fleet_tui.scheduler.series import Counters, SeriesCollector, by_host
from fleet_tui.scheduler.series import load as load_series
from fleet_tui.scheduler.series import prune as prune_series
from fleet_tui.scheduler.states import TaskStatus
from fleet_tui.scheduler.store.changes import changed
from fleet_tui.scheduler.store.outage import Resilient, is_transient, store_error_of
from fleet_tui.scheduler.store.protocol import Store
from fleet_tui.scheduler.store.storeclock import StoreClock
from fleet_tui.scheduler.view import TaskMirror, build_snapshot, carry_over, midnight

log = logging.getLogger("fleet_tui.engine")

__all__ = ["TRANSIENT_GATES", "Engine", "Running"]

#: how long the store watcher waits for a change in one go (a lost wake-up costs at most this)
IDLE_WAIT_S = 30.0
#: how long the schedule loop sleeps at most when nothing wakes it: it then plans from what the
#: planner holds (no store read; nothing at all when no input moved, not even the gate)
PLAN_TICK_S = 1.0
#: the waiting reasons of the queue behind the tasks just started are written at most this often
#: (a start decides only the head of the queue: a 10,000-task queue walked at every start made
#: each start cost ~20 ms here; the tasks behind it wait behind full slots meanwhile)
REASONS_EVERY_S = 1.0


#: the housekeeping tick: the machine's headroom, the config file, the agents' memory, the snapshot
HOUSEKEEPING_S = 1.0
#: a quiet engine (nothing running, starting or queued here, no other engine's agents, nothing
#: new to show) takes one tick in this many: no decision waits on the headroom then, and its
#: readings (a dozen files of /proc and the cgroup, the config's stat) were half of an idle
#: engine's CPU; a task queued, an agent started or a change to show ends the quiet at the next
QUIET_TICKS = 5

#: the longest an ended attempt's verdict waits for the start of the agent taking its slot
START_FIRST_S = 0.05


class Engine(Controller):
    """One engine: its loops (scheduling, housekeeping, leases, commands) and the wiring of its
    collaborators — the launcher, the reaper, the adopter, the merger, the event writer and the
    rate-limit book, each given only what it needs."""

    home: Path

    def __init__(
        self,
        store: Store,
        home: Path,
        config: Config | None = None,
        *,
        host: str | None = None,
        tags: Sequence[str] = (),
        clock: Callable[[], float] = time.time,
        headroom: Callable[[], Headroom] | None = None,
        config_path: Path | None = None,
        shim_pool: ShimPool | None = None,
    ) -> None:
        self.cfg = config or Config()
        self.host = host or hostname()
        self.owner = f"{self.host}:{os.getpid()}:{os.urandom(3).hex()}"
        self.bus = Bus()
        # store outages are waited out (outage.py); a shorter SQLite busy timeout lets the engine
        # say what it waits for instead of hanging silently in a lock
        tune = getattr(store, "set_busy_timeout", None)
        if tune is not None:
            tune(10_000)
        #: what worker threads publish is queued on the loop, not waited for (onloop.py)
        self.post = LoopPost()
        self.resilient = Resilient(store, self.notice)
        super().__init__(
            self.resilient,
            actor=self.owner,
            clock=clock,
            cfg=ControlConfig(heartbeat_s=self.cfg.heartbeat_s),
            publish=functools.partial(self.post, self.publish_task),
        )
        self.home = Path(home)
        self.tags = tuple(tags) or tuple(self.cfg.host_tags)
        self._hb_ok_at = time.time()  # the last heartbeat the store accepted (wall clock)
        self._hb_busy = False
        self.series = SeriesCollector(self.host, key=self.owner)
        self._pulse_others: list[HostSeries] = []  # the other engines' stored series, last read
        self.runners: dict[str, Running] = {}
        #: claimed tasks whose attempt is being prepared and started (``_start``), each with the
        #: event set when its start has settled (its runner runs, or it failed to start)
        self._starting: dict[str, anyio.Event] = {}
        self.mem = MemoryModel()
        self._read_headroom = headroom or (lambda: read_headroom(self.home))
        self._headroom: Headroom | None = None
        self._wake = anyio.Event()
        self._stopping = False
        self._leave_running = False
        self._snapshot = Snapshot(taken_at=clock())
        self._others_of: Snapshot | None = None  # the snapshot ``_others_active`` last looked at
        self._others = False
        self._asking_of: Snapshot | None = None  # the snapshot ``_asking_ids`` was gathered from
        self._asking_ids: frozenset[str] = frozenset()
        self._tasks_mirror = TaskMirror()  # the snapshot's task list, kept by changes
        #: each task as this engine last published it, with the publication's number: a snapshot
        #: read while a task moved may hold the version before the move (``_fresher``)
        self._published: dict[str, tuple[int, Task]] = {}
        self._published_n = 0
        self._config_path = config_path
        self._watcher: Any = None
        self._tg: TaskGroup | None = None
        self._started = anyio.Event()
        self.idle_report: list[tuple[str, str]] = []
        #: ``run --until-idle --max-wait S``: do not sit out a time-based wait longer than this
        self.max_wait: float | None = None
        #: set when an until-idle run ended with a longer time-based wait left (see max_wait)
        self.left_time_waits = False
        #: set when it ended because a headroom gate held the whole queue longer than max_wait
        self.left_gate_wait = False
        #: since when (monotonic) a headroom gate holds the whole queue with nothing running here
        self._held_since: float | None = None
        #: the shims' fork server: given when it was started before the engine was made (cli.py)
        self.shim_pool: ShimPool | None = shim_pool
        #: settings given on the command line win over config.toml, also after a hot reload
        self.overrides: dict[str, Any] = {}
        # the collaborators: each reads the settings as they are now (a hot reload replaces them)
        settings = lambda: self.cfg  # noqa: E731
        self.rate_limits = RateLimitBook(self.store, self.clock, lambda: self.post(self.wake))
        self.writer = EventWriter(self.store, self.owner, self.notice)
        self.sink = AttemptSink(
            self.store,
            self.owner,
            self.runners,
            self.writer,
            self.rate_limits,
            self.bus.publish,
            self.publish_task,
            self.wake,
            lambda: self.planner.spent(),
        )
        self.launcher = Launcher(
            self.store, self.home, settings, self.clock, self.owner, lambda: self.shim_pool
        )
        self.merger = Merger(self.life, self.home, lambda: self.cfg.keep_worktrees, self.notice)
        self.reaper = Reaper(
            self.life, self.home, settings, self.policy, self.reviewer, self.mem, self.rate_limits,
            self.merger, self.sink.take, self.notice,
        )  # fmt: skip
        self.adopter = Adopter(self.life, settings, self.host, self._launch_runner, self.wake, self.home)
        self.planner = Planner(
            self.store,
            config=lambda: self.cfg,
            clock=self.clock,
            tags=self.tags,
            running=self.slots_taken,
            headroom=lambda: self._headroom or read_headroom(self.home),
            mem=self.mem,
            midnight=midnight,
        )
        #: moves with every change here or in the store (what the snapshot and watchers key on)
        self.generation = 0
        self._commands_due = anyio.Event()
        self._snap_generation = -1
        self.quiet_ticks = 0  # housekeeping ticks a quiet engine left out (benchmarks, tests)
        self._snap_at = 0.0
        self._reported_at = 0.0
        self._admitted: Admission | None = None
        self._reasons_due = False  # the queue behind the last pick has reasons not yet written
        self._reasons_at = 0.0
        #: short blocking work (claiming and starting a task in place, a verdict with nothing to
        #: verify) runs on one worker thread at a time: each hand-over shares the interpreter with
        #: the loop, and four of them at once (agents that end together) shared it with each
        #: other too. 300 x `true`, in turn three times: 1.07-1.11 s and 5.2-5.4 ms of CPU per
        #: attempt against 1.20-1.24 s and 5.9-6.2 ms with a thread each. Long work (a worktree,
        #: its setup, verifiers) keeps the shared pool (``_lane_for``)
        self.lane = anyio.CapacityLimiter(1)
        #: the cap recorded for ``plan`` in other processes (caps.py), -1 before the first
        self._cap_saved = -1

    def notice(self, text: str) -> None:
        """A notice for the cockpit, from a worker thread (or the loop's own)."""
        self.post(self.bus.publish, [Notice(text)])

    # -- the boundary -------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def subscribe(self) -> AsyncIterator[list[EngineEvent]]:
        # the bus's own stream: a generator of the engine's around it cost every batch of every
        # subscriber (the printer of `run`, the notifier) a second hop
        return self.bus.subscribe()

    def wake(self, read: bool = True) -> None:
        """Something changed (here, or in the store): plan again, and rebuild the snapshot.
        ``read``: the planner reads the store first; False when the change is one it can plan
        from what it holds (a task ended that nothing queued waits on)."""
        self.generation += 1
        if read:
            self.planner.invalidate()
        self._wake.set()

    def nudge(self) -> None:
        """A slot was freed or taken back and nothing in the store changed: plan again, from
        what the planner knows (no store read)."""
        self._wake.set()

    def publish_task(self, task: Task | None) -> None:
        if task is None:
            return
        self._published_n += 1
        self._published[task.id] = (self._published_n, task)
        self.bus.publish([TaskChanged(task)])
        if task.status in (TaskStatus.RUNNING, TaskStatus.VERIFYING):
            self.generation += 1  # the snapshot shows it; no plan changes while it runs
        else:  # queued again, or ended: read first only if the queue as planned may differ
            self.wake(read=self.planner.affected_by(task))

    # -- run ----------------------------------------------------------------------------------
    async def run(self, until_idle: bool = False) -> None:
        self.post.bind()
        me = os.getpid()
        await anyio.to_thread.run_sync(
            self.store.register_engine,
            self.owner,
            self.host,
            me,
            float(shimmod.proc_start_ticks(me) or 0),
            self.clock(),
        )
        await anyio.to_thread.run_sync(self._start_records)
        if self.cfg.max_concurrent > 0:
            if self.shim_pool is None:
                self.shim_pool = ShimPool.for_home(self.home, self.cfg.max_concurrent, self.cfg.agent_nice)
            await anyio.to_thread.run_sync(self.shim_pool.fill)
        if self._config_path is not None:
            self._watcher = ConfigWatcher(self._config_path)
        try:
            async with anyio.create_task_group() as outer:
                await self._tick_housekeeping(first=True)
                outer.start_soon(self._housekeeping_loop)
                outer.start_soon(self._lease_loop)
                outer.start_soon(self.writer.run)
                outer.start_soon(self._command_loop)
                outer.start_soon(self._store_watch_loop)
                outer.start_soon(  # pull request state, issue comments
                    prwatch.watch, self.store, self.clock, self.owner, lambda: self.cfg.github_poll_s,
                    self.notice, self.publish_task, lambda: self.generation,
                    lambda: self.snapshot().tasks,
                )  # fmt: skip
                outer.start_soon(notify.watch, self)  # notifications and the loop guard (notify/)
                async with anyio.create_task_group() as rtg:
                    self._tg = rtg
                    await anyio.to_thread.run_sync(reap_stale, self.home)
                    await self._adopt_orphans()
                    await self._sweep_worktrees()
                    self._started.set()
                    await self._schedule_loop(until_idle)
                    if self._leave_running:
                        await self._hand_over()
                        for r in list(self.runners.values()):
                            if r.verifying:  # a verifier is no agent: it stops with its engine
                                r.runner.stop(StopReason.SHUTDOWN)
                        rtg.cancel_scope.cancel()
                    else:
                        for r in list(self.runners.values()):
                            r.runner.stop(StopReason.SHUTDOWN)
                outer.cancel_scope.cancel()
        except Exception as e:
            err = store_error_of(e)
            with anyio.CancelScope(shield=True):
                await notify.engine_failed(self, err or e)
            if err is not None and err is not e:
                raise err from None  # one clear store error, not a group of tracebacks
            raise
        finally:
            with anyio.CancelScope(shield=True):
                if self.resilient.down_since is not None:
                    self.resilient.giving_up.set()  # never hold the exit waiting on the store
                if self.shim_pool is not None:
                    await anyio.to_thread.run_sync(self.shim_pool.close)
                try:
                    if self._leave_running or not self._stopping:
                        await self._hand_over()
                    await anyio.to_thread.run_sync(
                        self.resilient.call_once, "unregister_engine", self.owner, self.clock()
                    )
                    await anyio.to_thread.run_sync(
                        self.resilient.call_once, "set_setting", caps.key(self.owner), None
                    )
                except Exception as e:  # best effort: it must not hide why the engine stopped
                    log.warning("could not record this engine's stop in the store: %s", e)
                self.bus.close()

    def _start_records(self) -> None:
        """The store's records of engines, at this one's start (one hand-over): each engine's run
        leaves its pulse for the hour after it, older ones go now; the cap this engine runs with
        is recorded (``plan`` in another process counts against it), and those of engines no
        longer live are dropped (caps.py)."""
        prune_series(self.store, self.clock())
        live = {e["owner"] for e in self.store.live_engines(self.clock(), self.cfg.stale_s)}
        caps.prune(self.store, live | {self.owner})
        self._cap_saved = self.cfg.max_concurrent
        caps.save(self.store, self.owner, self._cap_saved)

    async def shutdown(self, leave_running: bool) -> None:
        """Stop scheduling; leave agents running for a later adopter, or stop them all.

        Returns once that is done (leases handed over, or every agent stopped and its task
        requeued), so a caller may exit right after — the cockpit does."""
        self._leave_running = leave_running
        self._stopping = True
        self.wake()
        if leave_running:
            await self._hand_over()
            return
        for r in list(self.runners.values()):
            r.runner.stop(StopReason.SHUTDOWN)
        with anyio.move_on_after(self.cfg.kill_grace_s + 15):
            while self.runners:
                await next(iter(self.runners.values())).done.wait()
        if self.runners and self.resilient.down_since is not None:
            self.resilient.giving_up.set()  # the store is down: what is left is adopted later

    async def _hand_over(self) -> None:
        """Keep the leases of running agents alive long enough for a later engine to adopt them."""
        if not self._leave_running:
            return
        for r in list(self.runners.values()):
            await self._hand_over_one(r)

    async def _hand_over_one(self, r: Running) -> None:
        hold_s = self.cfg.leave_running_h * 3600
        write_lease(r.dir, time.time() + hold_s)  # the shim's clock
        await anyio.to_thread.run_sync(self.store.extend_lease, r.task.id, self.owner, self.clock() + hold_s)

    async def _schedule_loop(self, until_idle: bool) -> None:
        while not self._stopping:
            self._wake = anyio.Event()
            started = await self._admit()
            if started or self.runners or self._starting:
                self._held_since = None
            if (
                until_idle
                and not self.runners
                and not self._starting
                and not started
                and await self._nothing_startable()
            ):
                return
            if started:
                continue
            timeout = PLAN_TICK_S
            if self._reasons_due:
                wait = self._reasons_at + REASONS_EVERY_S - time.monotonic()
                if wait <= 0:
                    await self._write_reasons()
                else:
                    timeout = wait
            # sleep until a local event (task added here, agent exited, command), a change made by
            # another process (the store watcher wakes us), a headroom reading that changes a
            # decision (housekeeping wakes us), or the earliest time-based gate opens (a backoff,
            # a rate-limit reset, the budget's new day)
            due = self.planner.next_at()
            if due is not None:
                timeout = min(timeout, max(0.0, due - self.clock()) + 0.05)
            with anyio.move_on_after(timeout):
                await self._wake.wait()
        # stopping: wait for runners to finish when they were told to stop
        await self._starts_settled()
        if not self._leave_running:
            for r in list(self.runners.values()):
                r.runner.stop("shutdown")
            while self.runners:
                await next(iter(self.runners.values())).done.wait()

    async def _store_watch_loop(self) -> None:
        """The engine's one wake-up from the store: another process committed (a task added by
        the CLI, a command, an answer, a peer's claim) -> plan again, look at commands."""
        token = await anyio.to_thread.run_sync(self.store.change_token)
        while True:
            new = await changed(self.store, token, IDLE_WAIT_S)
            if new != token:
                token = new
                self._commands_due.set()
                self.wake()

    async def _nothing_startable(self) -> bool:
        """True when nothing can change without a person or an outside event: no queued task can
        start now, and none waits on a time. Headroom gates (load, memory, disk) are transient
        and time-based waits (a retry's backoff, a rate-limit reset, the daily budget's new day)
        end by themselves, so ``--until-idle`` sits them out (up to ``max_wait``, if given);
        what is left waits on a person, a parked dependency, or tags this host lacks."""
        decisions = await self.plan()
        self.idle_report = [(t.name, d.reason or "ready") for t, d in decisions]
        idle, left = settled(decisions, self.clock(), self.max_wait)
        if not idle and self.max_wait is not None and not any(d.ok for _, d in decisions):
            # held by a gate that has no end time (memory, disk, load): ``--max-wait`` bounds
            # that wait too, counted from when it began with nothing running here (a CI job on a
            # full disk waited until its own timeout killed it)
            now = time.monotonic()
            if self._held_since is None:
                self._held_since = now
            elif now - self._held_since > self.max_wait:
                idle = left = self.left_gate_wait = True
        if left:
            self.left_time_waits = True
        if not idle:
            return False
        # tasks still marked running under a dead engine come back once its lease expires:
        # someone has to be there to reclaim them
        orphans = await anyio.to_thread.run_sync(self.store.orphaned_tasks, self.clock(), self.cfg.stale_s)
        return not [t for t in orphans if t.owner != self.owner]

    def gate_config(self) -> GateConfig:
        return self.planner.gate_config()

    async def plan(self, admitting: bool = False) -> Plan:
        """Every queued task with its admission decision here, now (``fleet-tui plan``); starts
        nothing. Reads the store only when something changed since the last plan."""
        decided = self.planner.plan_from_memory(admitting)  # no thread hand-over for it
        if decided is not None:
            return decided
        # the slots are counted here, on the loop that starts and ends the runners they count
        return await anyio.to_thread.run_sync(self.planner.plan, admitting, self.slots_taken())

    async def _write_reasons(self) -> None:
        """Record the waiting reasons of the whole queue, as a whole plan gives them (the tasks
        behind the last pick's head). A task that may start now is left to the next pick."""
        self._reasons_due = False
        self._reasons_at = time.monotonic()
        decisions = await self.plan(admitting=True)
        await self._record_reasons(
            {k: why for k, why in self.planner.waiting_changes(decisions).items() if why}
        )

    async def _record_reasons(self, changed: dict[str, str | None]) -> None:
        """Write waiting reasons that changed, and tell the planner they were written."""
        if changed:
            await anyio.to_thread.run_sync(self.store.set_waiting, changed)
            self.planner.recorded(changed)
            # the snapshot shows them, and `run` prints them: a queue held by a gate, with
            # nothing else moving, changed only here (a run on a full disk printed nothing)
            self.generation += 1

    async def _admit(self) -> bool:
        if self._stopping:
            return False
        taken = self.slots_taken()
        if taken >= self.cfg.max_concurrent:
            if self.planner.needs_read():
                # read what changed now, while no slot is free: when one frees, its next task is
                # picked from memory, without a store read between an agent's end and the next
                await anyio.to_thread.run_sync(self.planner.refresh)
            return False
        free = self.cfg.max_concurrent - taken
        admission = self.planner.admit(free, taken)  # from memory: no thread hand-over for it
        if admission is None:
            reading = functools.partial(self.planner.admit, free, taken, wait=True)
            admission = await anyio.to_thread.run_sync(reading)
            assert admission is not None  # it waits: it always answers
        if admission is self._admitted:
            return False  # the very pick made last time (nothing moved): nothing new to do
        self._admitted = admission
        picked = list(admission.picked[: max(0, self.cfg.max_concurrent - self.slots_taken())])
        if not admission.whole:
            self._reasons_due = True
        # a task about to be claimed needs no write of its own: the claim clears its reason
        going = {t.id for t in picked}
        await self._record_reasons(
            {
                k: why
                for k, why in self.planner.waiting_changes(admission.head).items()
                if why or k not in going
            }
        )
        if self._stopping or not picked:
            return False
        self.planner.recorded(dict.fromkeys(going))
        for t in picked:
            # claimed, prepared and started on its own, in one hand-over to a thread: the next
            # claim need not wait for this one's files, store writes and fork (the slot counts
            # as taken from now on: ``slots_taken``; a claim that fails gives it back)
            self.planner.claiming(t.id)
            self._starting[t.id] = anyio.Event()
            assert self._tg is not None
            self._tg.start_soon(self._start, t)
        return True

    # -- one attempt --------------------------------------------------------------------------
    async def _start(self, task: Task) -> None:
        """Start a picked task's attempt, then supervise it to its end in this same task (a task
        of its own in the group cost some 30 us more an attempt on the engine's loop: anyio's
        ``start_soon`` is that dear)."""
        started: tuple[Running, Launch] | None = None
        try:
            started = await self._start_one(task)
        finally:
            self._starting.pop(task.id).set()
            if started is None:
                # a start that failed gave its slot back (its task's move, or a lost claim, told
                # the planner what changed). One that started holds the slot it held while
                # starting, as its runner now: nothing to plan again for (a pass of the schedule
                # loop an attempt, to find the slots still full)
                self.nudge()
        if started is None:
            return
        r, launch = started
        if self._stopping:
            # the fleet stopped while this one was being started (a long worktree setup, say):
            # it gets what the others got, without holding up the stop
            if self._leave_running:
                await self._hand_over_one(r)
            else:
                r.runner.stop(StopReason.SHUTDOWN)
        await self._supervise(r, launch)

    async def _starts_settled(self) -> None:
        """Wait until every claimed task being started has its runner (or failed to start):
        stopping, handing over or waiting for runners must see every one of them."""
        while self._starting:
            await next(iter(self._starting.values())).wait()

    async def _start_one(self, queued: Task) -> tuple[Running, Launch] | None:
        """Claim, prepare and start the task's attempt; its runner, to be supervised (None when
        it did not start)."""
        now = self.clock()

        def claim_and_prepare() -> tuple[Task | None, Launch | Exception | None]:
            task = self.store.claim(
                self.owner, self.host, self.tags, now, self.cfg.lease_s, self.cfg.default_coder,
                self.cfg.default_model, only_task=queued.id,
            )  # fmt: skip
            if task is None:
                return None, None
            self.post(self.publish_task, task)
            try:
                return task, self.launcher.prepare(task)
            except (LaunchError, OSError) as e:
                return task, e

        try:
            task, launch = await anyio.to_thread.run_sync(claim_and_prepare, limiter=self._lane_for(queued))
        except BaseException:
            self.planner.unclaimed(queued.id)
            raise
        if task is None:
            self.planner.unclaimed(queued.id)  # another engine took it, or it changed: read again
            return None
        self.planner.claimed(task.id)
        if isinstance(launch, LaunchError):
            move = lc.never_started(str(launch))
            await anyio.to_thread.run_sync(lambda: self.life.apply(task, move, held=True))
            return None
        if isinstance(launch, OSError):  # a full disk, say: not the task's fault; back to the queue
            move = lc.requeue_later(str(launch), self.clock() + 60.0)
            self.bus.publish([Notice(f"{task.name}: {move.reason}")])
            await anyio.to_thread.run_sync(lambda: self.life.apply(task, move, held=True))
            return None
        assert isinstance(launch, Launch)
        return self._runner_for(task, launch), launch

    def _launch_runner(self, task: Task, launch: Launch) -> None:
        """Supervise an adopted attempt: a runner on its shim, in the runners' group."""
        running = self._runner_for(task, launch)
        assert self._tg is not None
        self._tg.start_soon(self._supervise, running, launch)

    def _runner_for(self, task: Task, launch: Launch) -> Running:
        """The runner of a started (or adopted) attempt on its shim, counted among the runners."""
        # a first attempt has none before it: no store read on the loop for it
        earlier = [a for a in self.store.attempts(task.id) if a.n < task.attempt] if task.attempt > 1 else []
        base_cost = sum(a.cost_usd or 0.0 for a in earlier)
        base_tokens = sum(a.tokens or 0 for a in earlier)
        budget = task.spec.budget_usd
        limits = RunLimits(
            max_line_bytes=self.cfg.max_line_bytes,
            stall_s=(task.spec.stall_min or self.cfg.stall_min) * 60,
            timeout_s=(task.spec.timeout_min or self.cfg.timeout_min) * 60,
            context_share=self.cfg.context_handoff_share,
            budget_usd=None if budget is None else max(0.0, budget - base_cost),
            grace_s=self.cfg.kill_grace_s,
        )
        tid, n = task.id, task.attempt

        async def sink(events: list[Event], offset: int) -> None:
            await self.sink.take(tid, n, events, offset)

        runner = AttemptRunner(
            task_id=tid,
            attempt=n,
            attempt_dir=launch.dir,
            coder=launch.coder,
            limits=limits,
            offset=launch.offset,
            next_seq=launch.next_seq,
            popen=launch.popen,
            shim_pid=launch.shim_pid,
            shim_ticks=launch.shim_ticks,
            sink=sink,
            clock=self.clock,
            started_at=launch.started_at,
            is_asking=lambda: self._asking(tid),
        )
        if task.status == TaskStatus.PAUSED:
            runner.paused = True
        if launch.adopted:  # a follow-up its previous engine was waiting to deliver at a turn boundary
            runner.watch = adopted_watch(self.store, self.cfg.followup_grace_s, tid, n, self.clock())
        running = Running(
            task,
            runner,
            launch.dir,
            launch.coder_name,
            account_of(launch.coder_name, task.model or task.spec.model),
        )
        running.base_cost, running.base_tokens = base_cost, base_tokens
        self.runners[tid] = running
        return running

    def _lane_for(self, task: Task, verdict: bool = False) -> anyio.CapacityLimiter | None:
        """``lane`` for this task's start (or its verdict) when that work is short: in place (no
        worktree to make, no WIP commit, no merge) and, for a verdict, nothing to verify. Else
        None: the worker threads' shared pool, where a worktree's setup or a verifier that runs
        for minutes holds up no other start or verdict."""
        if task.spec.git_ref or (verdict and task.spec.verify):
            return None
        return self.lane

    def _asking(self, task_id: str) -> bool:
        """Whether the task waits on a person's answer, by the latest snapshot. Every runner asks
        on every poll: the ids are gathered once per snapshot, not looked for in the whole queue
        on each ask (which cost a scan of every task per poll: 3 % of a 600-task run's loop)."""
        snap = self._snapshot
        if self._asking_of is not snap:
            self._asking_ids = frozenset(t.id for t in snap.tasks if t.asking)
            self._asking_of = snap
        return task_id in self._asking_ids

    def slots_taken(self) -> int:
        """The attempts that hold a slot (``max_concurrent``): every one being started, every
        live agent, and an ended one while its verifiers may still run. A task without verifiers
        lets go of its slot the moment its agent ends, so the next agent starts while its
        verdict is written. Count them on the engine's loop only: it walks the runners the loop
        adds and removes (``plan`` hands the count to the planner's thread)."""
        return len(self._starting) + sum(1 for r in self.runners.values() if not r.released)

    async def _supervise(self, r: Running, launch: Launch) -> None:
        task = r.task
        failed = True
        try:
            result = await r.runner.run()
            if not task.spec.verify:
                r.released = True
                self.nudge()
                await self._start_goes_first()
            await self.reaper.finish(r, result, self._lane_for(task, verdict=True))
            failed = False
        except Exception as e:  # one task's bad ending must not take the engine down
            log.exception("finishing %s failed", task.name)
            self.bus.publish([Notice(f"{task.name}: finishing failed: {e!r}")])
        finally:
            # let go of the attempt: its lease ends now, for the sweeps that read it (wtmark.py:
            # worktrees only; nothing reads an in-place attempt's lease once its shim is gone)
            if (r.task.worktree or r.task.spec.git_ref) and not r.runner.shim_alive():
                with contextlib.suppress(OSError):
                    write_lease(r.dir, 0.0)
            # only this attempt's own entry: a task requeued by this attempt's verdict (a crash,
            # a retry) may already run its next attempt under the same id, started while this
            # verdict was written; dropping that runner lost it (``--until-idle`` then saw no
            # agent and stopped, and a slot counted as free while its agent ran)
            if self.runners.get(task.id) is r:
                del self.runners[task.id]
            r.done.set()
            # its slot is free: plan again. What its verdict changed in the queue came through
            # ``publish_task`` (and a blocked account through the rate-limit book); a verdict
            # that failed to be written may have left anything: read the store again then
            self.wake(read=failed)

    async def _start_goes_first(self) -> None:
        """Let the start of the agent that takes a freed slot go before this attempt's verdict:
        both are blocking work on worker threads, and run together they share the interpreter
        and the store's lock, which delays the next agent by milliseconds. The verdict waits
        for the starts under way once the schedule loop has claimed (``START_FIRST_S`` at
        most: a worktree's setup may take minutes)."""
        await anyio.sleep(0)  # the schedule loop, woken by the freed slot, claims first
        pending = list(self._starting.values())
        if pending:
            with anyio.move_on_after(START_FIRST_S):
                for ev in pending:
                    await ev.wait()

    def reviewer(self, task: Task) -> AgentReviewer | None:
        """How ``agent`` verifiers of this task ask a read-only reviewer (see review.py)."""
        if not any(v.kind == "agent" for v in task.spec.verify):
            return None
        return make_reviewer(self.home, task, self.cfg)

    def policy(self) -> Policy:
        return Policy(
            max_retries=self.cfg.max_retries,
            retry_backoff_s=tuple(self.cfg.retry_backoff_s),
            max_handoffs=self.cfg.max_handoffs,
        )

    # -- housekeeping: heartbeat, leases, headroom, config, snapshot ---------------------------
    async def _housekeeping_loop(self) -> None:
        skipped = 0
        while True:
            await anyio.sleep(HOUSEKEEPING_S)
            if skipped + 1 < QUIET_TICKS and self._quiet():
                skipped += 1
                self.quiet_ticks += 1
                continue
            skipped = 0
            await self._tick_housekeeping()

    def _quiet(self) -> bool:
        """Nothing here would use a fresh housekeeping tick (``QUIET_TICKS``): no agent runs or
        starts here, no task is queued here (none waits on the headroom), no other engine's
        agent runs (an orphan to adopt), and the snapshot shows every change."""
        return (
            not self.runners
            and not self._starting
            and self.planner.queued() == 0
            and self.generation == self._snap_generation
            and not self._others_active()
        )

    async def _lease_loop(self) -> None:
        """Keep the shims' lease files and the store's leases alive, on a wall-clock timer of its
        own: slow housekeeping (snapshots, memory readings) must never let an agent's lease lapse,
        or its shim stops it. The heartbeat runs beside it, so a store that hangs (a lock, an
        outage) does not stop the lease files; those never reach further than half a lease past
        the last heartbeat the store accepted, so an agent stops before its task can be taken."""
        async with anyio.create_task_group() as tg:
            while True:
                await anyio.sleep(max(0.2, min(self.cfg.heartbeat_s, self.cfg.lease_s / 6)))
                self._write_lease_files()
                if not self._hb_busy:
                    self._hb_busy = True
                    tg.start_soon(self._heartbeat)

    def _write_lease_files(self) -> None:
        # half a lease ahead (the shims' clock), but never so far past the last heartbeat the store
        # accepted that the agent could outlive its lease there (it needs the grace to stop)
        c = self.cfg
        bound = max(c.lease_s / 2, c.lease_s - c.kill_grace_s - 0.5)
        deadline = min(time.time() + c.lease_s / 2, self._hb_ok_at + bound)
        for r in list(self.runners.values()):
            try:
                write_lease(r.dir, deadline)
            except OSError as e:
                self.bus.publish([Notice(f"cannot renew a lease: {e}")])

    async def _heartbeat(self) -> None:
        started = time.time()
        try:
            await anyio.to_thread.run_sync(
                self.resilient.call_once, "heartbeat", self.owner, self.clock(), self.cfg.lease_s
            )
            if started - self._hb_ok_at > self.cfg.stale_s and self._cap_saved >= 0:
                # silent long enough to count as gone (a suspended laptop, a store outage): an
                # engine that started meanwhile dropped our cap (caps.prune); say it again
                await anyio.to_thread.run_sync(caps.save, self.store, self.owner, self._cap_saved)
            self._hb_ok_at = started
        except Exception as e:
            if not is_transient(e):
                raise
        finally:
            self._hb_busy = False

    async def _renew_leases(self) -> None:
        # the store first (its answer bounds the lease files), then the files
        await self._heartbeat()
        self._write_lease_files()

    def _tick_reads(
        self, first: bool, pids: list[int]
    ) -> tuple[Config | None, str | None, Headroom, list[int | None]]:
        """What a housekeeping tick reads, in one worker call (an idle engine's second costs one
        hand-over): the database file still there (raises StoreError when it was deleted or
        replaced under us), the config file, the machine's headroom, the agents' memory (one
        scan of /proc for every tree)."""
        check = getattr(self.resilient.inner, "check_file", None)
        if check is not None:
            check()
        new_cfg, err = self._watcher.poll() if self._watcher is not None and not first else (None, None)
        return new_cfg, err, self._read_headroom(), trees_memory(pids)

    async def _tick_housekeeping(self, first: bool = False) -> None:
        self._hk_n = getattr(self, "_hk_n", 0) + 1
        # agent memory: a new agent at once, then every 5 s
        running = [
            (r, r.runner.shim_pid)
            for r in self.runners.values()
            if r.runner.shim_pid and (not r.peak_mem or self._hk_n % 5 == 0)
        ]
        new_cfg, err, headroom, mems = await anyio.to_thread.run_sync(
            self._tick_reads, first, [pid for _, pid in running]
        )
        if new_cfg is not None:
            self.cfg = dataclasses.replace(new_cfg, **self.overrides)
            self.bus.publish([Notice("config reloaded")])
            self.wake()
        elif err:
            self.bus.publish([Notice(f"config not reloaded: {err}")])
        if self.cfg.max_concurrent != self._cap_saved:  # a reload, or ``set_config``
            self._cap_saved = self.cfg.max_concurrent
            await anyio.to_thread.run_sync(caps.save, self.store, self.owner, self._cap_saved)
        if isinstance(self.clock, StoreClock) and self._hk_n % 30 == 0:
            await anyio.to_thread.run_sync(self.clock.refresh)
        if first:
            await self._renew_leases()
        elif self._hk_n % max(1, int(self.cfg.heartbeat_s)) == 0 and self._others_active():
            await self._adopt_orphans()
        before = self.planner.headroom_key(self._headroom)
        self._headroom = headroom
        if self.planner.headroom_key(self._headroom) != before:
            self._wake.set()  # plan again (from what the planner holds: no store read)
        for (r, _), m in zip(running, mems, strict=True):
            if m:
                r.peak_mem = max(r.peak_mem, m)
        await self._refresh_snapshot()
        if self._hk_n % 60 == 0:
            await anyio.to_thread.run_sync(self.store.maintenance)

    def _host_row(self, now: float, running: int) -> Host:
        """This host's row (``running``: ``slots_taken``, counted on the loop)."""
        h = self._headroom
        return Host(
            name=self.host,
            heartbeat=now,
            cores=h.cores if h else 0,
            load=h.load_per_core if h else None,
            mem_available=h.mem_available if h else None,
            disk_free=h.disk_free if h else None,
            running=running,
            tags=self.tags,
            version=__version__,
        )

    def _others_active(self) -> bool:
        """A task runs under another engine (by the latest snapshot, rebuilt on every change):
        only then can an orphan appear without a change in the store (its engine dies). Worked
        out once per snapshot: asked every second, it walked a 10,000-task queue each time."""
        snap = self._snapshot
        if self._others_of is not snap:
            self._others_of = snap
            self._others = any(
                t.owner not in (None, self.owner)
                and (t.status in (TaskStatus.RUNNING, TaskStatus.VERIFYING) or t.paused_running)
                for t in snap.tasks
            )
        return self._others

    def _snapshot_stale(self, now: float) -> bool:
        """The snapshot must be built from the store again: something changed since the last
        build, agents run here (their figures move), or it shows something that changes with
        time alone (a rate-limit hold, another host) and a minute passed."""
        if self.generation != self._snap_generation or self.runners:
            return True
        snap = self._snapshot
        timed = bool(snap.gauges.rate_holds) or any(h.name != self.host for h in snap.hosts)
        return timed and now - self._snap_at >= 60.0

    def _pulse(self, now: float) -> tuple[HostSeries, ...]:
        """Each host's pulse: the other engines' rows as last read, with this engine's own,
        fresher than its stored row, added to its host's."""
        return by_host([*self._pulse_others, self.series.series(now)], now)

    async def _refresh_snapshot(self) -> None:
        # the pulse for sparklines (scheduler/series.py), taken on the loop where runners change
        pulse = [
            Counters(
                (tid, r.runner.attempt),
                getattr(r.runner.normalizer, "seq", r.runner.next_seq),
                r.runner.tokens,
                r.runner.cost_usd or 0.0,
            )
            for tid, r in self.runners.items()
        ]
        self.series.observe(self.clock(), len(pulse), pulse)
        mem, source = self.mem.estimate_with_source(self.cfg.default_coder)
        full = self._snapshot_stale(self.clock())
        if full:
            self._snap_generation, self._snap_at = self.generation, self.clock()

        # the host row and the pulse: each second while something happens, every heartbeat
        # while nothing does (each write wakes every other engine and cockpit on the store)
        report = full or time.monotonic() - self._reported_at >= self.cfg.heartbeat_s
        if report:
            self._reported_at = time.monotonic()
        running = self.slots_taken()  # here: ``work`` may run on a worker thread

        def work() -> Snapshot:
            now = self.clock()
            h = self._headroom
            if report:
                self.series.save(self.store, now)
                self.store.upsert_host(self._host_row(now, running))
            if not full:  # nothing changed: the machine's figures and the pulse, no store read
                g = dataclasses.replace(
                    self._snapshot.gauges,
                    load_per_core=h.load_per_core if h else None,
                    mem_available=h.mem_available if h else None,
                    disk_free=h.disk_free if h else None,
                    agent_mem=mem,
                    agent_mem_measured=source == "measured",
                )
                return dataclasses.replace(self._snapshot, taken_at=now, gauges=g, series=self._pulse(now))
            self._pulse_others = load_series(self.store, now, skip=self.series.key)
            return build_snapshot(
                self.store,
                self.cfg,
                now,
                load=h.load_per_core if h else None,
                mem=h.mem_available if h else None,
                disk=h.disk_free if h else None,
                pulse=self._pulse(now),
                agent_mem=(mem, source == "measured"),
                mirror=self._tasks_mirror,  # reads only the task rows that changed
                owner=self.owner,  # its slots: its own agents against its own cap
            )

        prev = self._snapshot
        read_after = self._published_n
        # nothing to write or read: the figures and the pulse are put together here, no hand-over
        built = await anyio.to_thread.run_sync(work) if report or full else work()
        if not full:
            self._snapshot = built
            self.bus.publish([GaugesChanged(built.gauges)])
            return
        snap, moved = carry_over(prev, self._fresher(built, read_after))
        self._snapshot = snap
        changed = [TaskChanged(t) for t in moved]
        oldq = {q.id for q in getattr(self, "_last_questions", ())}
        newq = [QuestionChanged(q) for q in snap.questions if q.id not in oldq]
        self._last_questions = snap.questions
        self.bus.publish([*changed, *newq, GaugesChanged(snap.gauges)])

    def _fresher(self, built: Snapshot, read_after: int) -> Snapshot:
        """``built`` with each task this engine published while it was read (publication number
        above ``read_after``) as published. The read ran on a worker thread while the loop went
        on: a task that moved meanwhile may have been read before its move, and handing that
        version on would undo the move already published (a run's log printed ``done ->
        running`` for a task that ran once, then ``running -> done`` again). The publication
        moved the generation, so the next build reads the store again; the versions published
        before this read began are in it, and are forgotten."""
        self._published = {tid: p for tid, p in self._published.items() if p[0] > read_after}
        if not self._published:
            return built
        late = {tid: t for tid, (_, t) in self._published.items()}
        return dataclasses.replace(built, tasks=tuple(late.get(t.id, t) for t in built.tasks))

    # -- commands -----------------------------------------------------------------------------
    async def _command_loop(self) -> None:
        while True:
            # commands come from other processes: their commit moves the store's change token and
            # the store watcher sets this (a minute's timeout covers a lost wake-up)
            self._commands_due = anyio.Event()
            cmds = await anyio.to_thread.run_sync(self.store.pending_commands, self.owner)
            for c in cmds:
                # shielded: an engine going idle (run --until-idle) must still answer the command
                # that made it idle, or the caller waits for nothing
                with anyio.CancelScope(shield=True):
                    res = await self._command_agent(c.verb, c.task_id or "")
                    await anyio.to_thread.run_sync(
                        self.store.finish_command, c.id, "done" if res.ok else "failed", res.message
                    )
            if cmds:
                self.wake()
            with anyio.move_on_after(60.0):
                await self._commands_due.wait()

    async def _command_agent(self, verb: str, tid: str) -> CommandResult:
        r = self.runners.get(tid)
        if verb == "followup" and r is not None:  # stop at the agent's next turn boundary
            c = self.cfg
            return await stop_at_turn(r, self.store, self.clock, c.followup_grace_s, c.kill_grace_s)
        return await command_agent(self.runners, verb, tid, self.store, self.life, self.cfg.kill_grace_s)

    async def stop_for_followup(self, task: Task) -> CommandResult | None:
        if task.id in self.runners:
            return await self._command_agent("followup", task.id)
        return await super().stop_for_followup(task)

    async def _routed(self, ref: str, verb: str, fallback: Callable[[str], Any]) -> CommandResult:
        task = await anyio.to_thread.run_sync(self.find, ref)
        if task is not None and task.id in self.runners:
            res = await self._command_agent(verb, task.id)
        else:
            res = await fallback(ref)
        self.publish_task(res.task)
        self.wake()
        return res

    async def kill(self, ref: str) -> CommandResult:
        return await self._routed(ref, "kill", super().kill)

    async def cancel(self, ref: str) -> CommandResult:
        return await self._routed(ref, "cancel", super().cancel)

    async def retry(self, ref: str) -> CommandResult:
        return await self._routed(ref, "retry", super().retry)

    async def pause(self, ref: str | None) -> CommandResult:
        if ref is None:
            res = await super().pause(None)
            self.wake()
            await self._refresh_snapshot()
            return res
        return await self._routed(ref, "pause", super().pause)

    async def resume(self, ref: str | None) -> CommandResult:
        if ref is None:
            res = await super().resume(None)
            self.wake()
            await self._refresh_snapshot()
            return res
        return await self._routed(ref, "resume", super().resume)

    async def add(self, specs: Sequence[TaskSpec]) -> CommandResult:
        res = await super().add(specs)
        self.wake()
        return res

    async def answer(self, question_id: str, text: str) -> CommandResult:
        res = await super().answer(question_id, text)
        self.generation += 1  # the snapshot reads questions again
        await self._refresh_snapshot()
        return res

    async def merge(self, ref: str) -> CommandResult:
        return await self.merger.merge(ref)

    async def set_config(self, key: str, value: str) -> CommandResult:
        if self._config_path is None:
            return CommandResult(False, "this engine has no config file")
        try:
            await anyio.to_thread.run_sync(set_value, self._config_path, key, value)
            loaded = await anyio.to_thread.run_sync(load_config, self._config_path)
            # the command line's settings win here too, as over a reload of the file
            self.cfg = dataclasses.replace(loaded, **self.overrides)
        except ConfigError as e:
            return CommandResult(False, str(e))
        self.wake()
        return CommandResult(True, f"{key} = {value}")

    async def _sweep_worktrees(self) -> None:
        """Remove clean worktrees of finished or unknown tasks (only inside the managed root)."""

        def keep(name: str) -> bool:
            # read at decision time: another engine may have added and started it meanwhile
            t = self.store.get_task(name)
            if t is not None and t.status not in (TaskStatus.DONE, TaskStatus.CANCELLED):
                return True
            # a live attempt of another store (another engine on this home may use another one)
            other = wtmark.live_attempt(self.home, name)
            return other is not None and other != getattr(self.store, "url", None)

        try:
            report = await anyio.to_thread.run_sync(wt.sweep, self.home / "worktrees", keep)
        except Exception as e:
            self.bus.publish([Notice(f"worktree sweep failed: {e}")])
            return
        if report.removed or report.kept_dirty:
            text = (
                f"worktrees swept: removed {len(report.removed)}, "
                f"kept {len(report.kept_dirty)} with uncommitted work"
            )
            self.bus.publish([Notice(text)])

    # -- adoption -----------------------------------------------------------------------------
    async def _adopt_orphans(self) -> None:
        now = self.clock()
        orphans = await anyio.to_thread.run_sync(self.store.orphaned_tasks, now, 0.0)
        for t in orphans:
            if t.owner == self.owner or t.id in self.runners:
                continue
            await self.adopter.adopt(t)
