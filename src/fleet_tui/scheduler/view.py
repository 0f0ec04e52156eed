"""A read-and-command view of a store whose engine runs elsewhere (``fleet-tui --attach``).

It implements the same EngineAPI as the engine, so the cockpit cannot tell the difference: the
snapshot is rebuilt from the store when it changed (at most once a second, and every 5 s), new
events of live tasks are read as soon as the store's change token moves and published in
batches, and commands go through the store (the ``commands`` table reaches the engine that owns
a task). It runs no agent and holds no process.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio

from fleet_tui.config import Config
from fleet_tui.scheduler import caps, series
from fleet_tui.scheduler.api import CommandResult
from fleet_tui.scheduler.bus import Bus
from fleet_tui.scheduler.control import Controller, archived_ids, hostname
from fleet_tui.scheduler.merger import Merger
from fleet_tui.scheduler.model import (
    AgentEvent,
    EngineEvent,
    Event,
    Gauges,
    GaugesChanged,
    HostSeries,
    Notice,
    QuestionChanged,
    RateLimit,
    Snapshot,
    Task,
    TaskChanged,
)
from fleet_tui.scheduler.policy.gate import REJECTED_HOLD_S
from fleet_tui.scheduler.policy.headroom import GIB, MemoryModel
from fleet_tui.scheduler.states import ACTIVE
from fleet_tui.scheduler.store.changes import changed
from fleet_tui.scheduler.store.protocol import Store


def midnight(now: float) -> float:
    """The local midnight that began ``now``'s day. Worked out once per minute (a day starts on a
    whole minute in every time zone): the planner asks on every plan."""
    return _midnight_of(int(now // 60))


@functools.lru_cache(maxsize=1)
def _midnight_of(minute: int) -> float:
    lt = time.localtime(minute * 60)
    return time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday, 0, 0, 0, 0, 0, -1))


class TaskMirror:
    """The store's task list, kept current with ``Store.tasks_changed_since``: a snapshot of ten
    thousand tasks where one changed reads one row, and hands the others over as the same objects
    (the very same tuple when nothing changed), so the cockpit skips them by identity."""

    def __init__(self) -> None:
        self.marker: int | None = None
        self.tasks: tuple[Task, ...] = ()

    def refresh(self, store: Store) -> tuple[Task, ...]:
        """Catch up with the store (blocking)."""
        got = store.tasks_changed_since(self.marker)
        self.marker = got.marker
        if got.full:
            self.tasks = carry_over_tasks(self.tasks, got.tasks)
        elif got.tasks:
            fresh = {t.id: t for t in got.tasks}
            tasks = [fresh.pop(t.id, t) for t in self.tasks]
            self.tasks = (*tasks, *fresh.values())  # the new ones, in queue order
        return self.tasks


def carry_over_tasks(old: tuple[Task, ...], new: tuple[Task, ...]) -> tuple[Task, ...]:
    """``new`` with each task equal to its version in ``old`` replaced by that same object."""
    before = {t.id: t for t in old}
    out = tuple(prev if (prev := before.get(t.id)) is not None and prev == t else t for t in new)
    same = len(out) == len(old) and all(a is b for a, b in zip(out, old, strict=True))
    return old if same else out


def build_snapshot(
    store: Store,
    cfg: Config,
    now: float,
    *,
    mirror: TaskMirror | None = None,
    load: float | None = None,
    mem: int | None = None,
    disk: float | None = None,
    pulse: Sequence[HostSeries] | None = None,
    agent_mem: tuple[int, bool] | None = None,
    owner: str | None = None,
) -> Snapshot:
    """The fleet as the store sees it (blocking). Headroom comes from the caller when it has a
    reading of its own machine, else from the freshest host row; the pulse of each host from the
    store (``series``) unless the caller gives it (``pulse``: one per host, with its own fresher
    copy in). ``agent_mem`` is the engine's learned (bytes, measured) figure for one more agent,
    else the assumed one.
    With a ``mirror`` only the tasks that changed since its last refresh are read. ``owner``:
    the engine whose snapshot this is; its slots gauge counts its own agents against its own
    ``max_concurrent`` and the other engines' apart (without one, every agent counts, against
    the slots every live engine runs with: caps.py; ``max_concurrent`` when none is live)."""
    hidden = archived_ids(store)
    every = mirror.refresh(store) if mirror is not None else tuple(store.list_tasks())
    tasks = tuple(t for t in every if t.id not in hidden) if hidden else every
    readings = store.rate_limits()
    rls = tuple(rl for rl, _ in readings)
    hosts = tuple(store.hosts())
    live = [h for h in hosts if now - h.heartbeat < 60]
    if load is None and mem is None and live:
        h = max(live, key=lambda h: h.heartbeat)
        load, mem, disk = h.load, h.mem_available, h.disk_free
    active = [t for t in tasks if t.status in ACTIVE]
    own = len(active) if owner is None else sum(1 for t in active if t.owner == owner)
    cap = cfg.max_concurrent
    if owner is None:  # every agent counts: against every live engine's slots, as each runs
        cap = caps.live_total(store, now, cfg.stale_s, cfg.max_concurrent)
    g = Gauges(
        running=own,
        running_elsewhere=len(active) - own,
        max_concurrent=cap,
        paused=store.get_setting("fleet_paused") == "1",
        load_per_core=load,
        mem_available=mem,
        mem_floor=int(cfg.mem_floor_gib * GIB),
        disk_free=int(disk) if disk is not None else None,
        rate_limits=rls,
        hosts=len(live) or len(hosts),
        budget_usd=cfg.budget_usd_daily,
        budget_spent_usd=store.spent_since(midnight(now)),
        max_load_per_core=cfg.max_load_per_core,
        disk_floor=int(cfg.disk_floor_gib * GIB),
        rate_limit_threshold=cfg.rate_limit_threshold,
        rate_holds=tuple((rl.account, until) for rl, b in readings if (until := held_until(rl, b, now))),
    )
    if agent_mem is None:
        est, source = MemoryModel().estimate_with_source(cfg.default_coder)
        agent_mem = (est, source == "measured")
    g = replace(g, agent_mem=agent_mem[0], agent_mem_measured=agent_mem[1])
    if pulse is None:
        pulse = series.by_host(series.load(store, now), now)
    return Snapshot(
        taken_at=now,
        tasks=tasks,
        questions=tuple(store.pending_questions()),
        hosts=hosts,
        gauges=g,
        series=tuple(pulse),
    )


def carry_over(old: Snapshot, new: Snapshot) -> tuple[Snapshot, list[Task]]:
    """``new``, with each task equal to its version in ``old`` replaced by that same object (and
    ``old``'s very tuple when no task changed), plus the tasks that changed or appeared.

    A snapshot is rebuilt from the store every second; handing unchanged tasks over as the same
    objects lets the cockpit skip ten thousand of them by identity instead of comparing them."""
    if new.tasks is old.tasks:  # a mirror's unchanged tuple: nothing to compare
        return new, []
    if len(new.tasks) == len(old.tasks) and all(a is b for a, b in zip(new.tasks, old.tasks, strict=True)):
        return replace(new, tasks=old.tasks), []
    before = {t.id: t for t in old.tasks}
    tasks: list[Task] = []
    changed: list[Task] = []
    for t in new.tasks:
        prev = before.get(t.id)
        if prev is not None and (prev is t or prev == t):
            tasks.append(prev)
        else:
            tasks.append(t)
            changed.append(t)
    if not changed and len(tasks) == len(old.tasks):
        return replace(new, tasks=old.tasks), []
    return replace(new, tasks=tuple(tasks)), changed


def held_until(rl: RateLimit, blocked_until: float | None, now: float) -> float | None:
    """Until when the gate holds an account back (``gate._rate_limit_gate``'s rule), else None."""
    until = blocked_until if blocked_until is not None and blocked_until > now else None
    if rl.status == "rejected":
        if rl.resets_at is not None:
            if rl.resets_at > now:
                until = max(until or 0.0, rl.resets_at)
        elif until is None and now < rl.observed_at + REJECTED_HOLD_S:
            until = rl.observed_at + REJECTED_HOLD_S
    return until


class AttachedView(Controller):
    """EngineAPI for a cockpit on a store whose engines run elsewhere."""

    home: Path

    def __init__(
        self, store: Store, home: Path, cfg: Config, *, clock: Callable[[], float] = time.time
    ) -> None:
        super().__init__(store, actor=f"cockpit@{hostname()}", clock=clock)
        self.home = home
        self.cfg = cfg
        self.bus = Bus()
        self._snapshot = Snapshot(taken_at=clock())
        self._seen: dict[str, tuple[int, int]] = {}
        self._stop = False
        self._engine_live: bool | None = None
        self._tasks = TaskMirror()
        self._followed: frozenset[str] | None = None
        self.merger = Merger(self.life, home, lambda: self.cfg.keep_worktrees)

    def snapshot(self) -> Snapshot:
        return self._snapshot

    async def subscribe(self) -> AsyncIterator[list[EngineEvent]]:
        async for batch in self.bus.subscribe():
            yield batch

    async def refresh(self) -> None:
        prev = self._snapshot
        oldq = {q.id for q in prev.questions}
        built = await anyio.to_thread.run_sync(
            lambda: build_snapshot(self.store, self.cfg, self.clock(), mirror=self._tasks)
        )
        snap, changed = carry_over(prev, built)
        self._snapshot = snap
        out: list[EngineEvent] = [TaskChanged(t) for t in changed]
        out += [QuestionChanged(q) for q in snap.questions if q.id not in oldq]
        out.append(GaugesChanged(snap.gauges))
        live = await anyio.to_thread.run_sync(
            lambda: bool(self.store.live_engines(self.clock(), self.cfg.stale_s))
        )
        if not live:  # the header says so, with the figures' age, for as long as it lasts
            beats = [h.heartbeat for h in snap.hosts]
            self._snapshot = replace(snap, stale_since=max(beats) if beats else snap.taken_at)
        if live != self._engine_live:  # without an engine nothing moves: the figures are old
            first, self._engine_live = self._engine_live is None, live
            beats = [h.heartbeat for h in snap.hosts]
            age = f"; last seen {int(self.clock() - max(beats))}s ago" if beats else ""
            text = (
                "an engine is running on this store"
                if live
                else f"no engine is running on this store{age}: nothing starts, the figures are its last"
            )
            if not (first and live):
                out.append(Notice(text))
        self.bus.publish(out)

    def follow_events(self, task_ids: frozenset[str] | None) -> None:
        """Read and publish the agent events of ``task_ids`` only (None: every live task's): the
        cockpit shows one task's stream, and reading a loud fleet's every event cost it more than
        all it draws. The others' positions still move, so a task followed later starts where
        its events are, never with a gap (the stream's first fill overlaps; it drops repeats)."""
        self._followed = task_ids

    async def poll_events(self) -> None:
        live = [t for t in self._snapshot.tasks if t.status in ACTIVE or t.id in self._seen]
        followed = self._followed

        def work() -> list[Event]:
            got: list[Event] = []
            for t in live:
                after = self._seen.get(t.id)
                if after is None or (followed is not None and t.id not in followed):
                    last = self.store.last_events(t.id, 1)
                    self._seen[t.id] = (last[-1].attempt, last[-1].seq) if last else (0, -1)
                    if after is not None and t.status not in ACTIVE:
                        self._seen.pop(t.id, None)
                    continue
                evs = self.store.events(t.id, after=after, limit=2000)
                if evs:
                    self._seen[t.id] = (evs[-1].attempt, evs[-1].seq)
                    got.extend(evs)
                if t.status not in ACTIVE and not evs:
                    self._seen.pop(t.id, None)
            return got

        evs = await anyio.to_thread.run_sync(work)
        if evs:
            self.bus.publish([AgentEvent(e) for e in evs])

    async def run(self) -> None:
        """Keep the view fresh until ``shutdown``: new events as soon as an engine commits them
        (the store's change token wakes the view: store/changes.py), the snapshot at most once a
        second while things change, and every 5 s regardless (whether an engine still lives is
        a matter of time). Nothing is read while nothing changes in between."""
        token = await anyio.to_thread.run_sync(self.store.change_token)
        moved, owed, refreshed, polled = True, True, float("-inf"), float("-inf")
        while not self._stop:
            now = time.monotonic()
            if (owed and now - refreshed >= 1.0) or now - refreshed >= 5.0:
                await self.refresh()
                owed, refreshed = False, time.monotonic()
            if moved:  # at most ten reads a second while agents stream (batches, not a read each)
                await anyio.sleep(max(0.0, polled + 0.1 - time.monotonic()))
                await self.poll_events()
                polled = time.monotonic()
            since = time.monotonic() - refreshed
            timeout = min(1.0, max(0.05, (1.0 if owed else 5.0) - since))
            new = await changed(self.store, token, timeout)
            moved, token = new != token, new
            owed = owed or moved
        self.bus.close()

    async def shutdown(self, leave_running: bool) -> None:
        self._stop = True

    async def merge(self, ref: str) -> CommandResult:
        return await self.merger.merge(ref)

    async def set_config(self, key: str, value: str) -> CommandResult:
        from fleet_tui.config import ConfigError, load_config, set_value

        path = self.home / "config.toml"
        try:
            await anyio.to_thread.run_sync(set_value, path, key, value)
            self.cfg = await anyio.to_thread.run_sync(load_config, path)
        except ConfigError as e:
            return CommandResult(False, str(e))
        return CommandResult(True, f"{key} = {value} (engines reload it within a second)")

    def __getattr__(self, name: str) -> Any:  # pragma: no cover - helpful error for missing API
        raise AttributeError(f"AttachedView has no {name!r}")
