"""A quiet engine (issue 14): one wake-up source, planning in proportion to change, and a load
gate that never stops the first agent.

Store reads are counted by a wrapper around a real SQLite store (every Store method that is not
a write or the change notification itself counts). No timing assertions: the one window (5 s of
idleness) asserts a count, not a duration.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from fleet_tui.config import Config
from fleet_tui.scheduler import engine as engine_mod
from fleet_tui.scheduler.engine import Engine
from fleet_tui.scheduler.model import Decision, Snapshot, Task, TaskChanged, TaskSpec
from fleet_tui.scheduler.planner import Planner, gate_config, headroom_key, settled
from fleet_tui.scheduler.policy.gate import GateConfig, GateInputs, decide, effective_load, plan
from fleet_tui.scheduler.policy.headroom import GIB, Headroom, MemoryModel
from fleet_tui.scheduler.states import TaskStatus as S
from fleet_tui.scheduler.store.protocol import TaskChanges
from fleet_tui.scheduler.store.sqlite_store import SqliteStore
from fleet_tui.scheduler.view import midnight

pytestmark = pytest.mark.timeout(120)

NOW = 1_700_000_000.0

#: Store methods that write, or are the change notification and its plumbing: not reads
NOT_READS = frozenset(
    {
        "register_engine",
        "unregister_engine",
        "heartbeat",
        "upsert_host",
        "set_setting",
        "set_waiting",
        "maintenance",
        "change_token",
        "wait_for_change",
        "on_change",
        "set_busy_timeout",
        "check_file",
        "close",
    }
)


class CountingStore:
    """A real store that counts the read calls made through it (thread-safe)."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.reads: Counter[str] = Counter()
        #: how many tasks each incremental ``tasks_changed_since`` returned
        self.changed: list[int] = []
        self._lock = threading.Lock()

    def total(self) -> int:
        with self._lock:
            return sum(self.reads.values())

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name in NOT_READS or name.startswith("_"):
            return attr

        def counted(*args: Any, **kw: Any) -> Any:
            with self._lock:
                self.reads[name] += 1
            out = attr(*args, **kw)
            if name == "tasks_changed_since" and not out.full:
                self.changed.append(len(out.tasks))
            return out

        return counted


def plenty() -> Headroom:
    return Headroom(cores=2, load_per_core=0.1, mem_available=64 * GIB, disk_free=500 * GIB, taken_at=NOW)


def spec(name: str, **kw: Any) -> TaskSpec:
    kw.setdefault("coder", "shell")
    kw.setdefault("command", "true")
    return TaskSpec(name=name, prompt=f"do {name}", **kw)


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Callable[[], SqliteStore]]:
    opened: list[SqliteStore] = []

    def make() -> SqliteStore:
        s = SqliteStore(str(tmp_path / "fleet.db"))
        opened.append(s)
        return s

    yield make
    for s in opened:
        s.close()


def config(**kw: Any) -> Config:
    base: dict[str, Any] = {"default_coder": "shell", "heartbeat_s": 1.0, "kill_grace_s": 0.5}
    base.update(kw)
    return Config(**base)


def _engine(tmp_path: Path, store: SqliteStore, n: int) -> Engine:
    """An engine at concurrency 4 over ``n`` independent tasks of `true` added to ``store``."""
    home = tmp_path / "home"
    home.mkdir()
    store.add_tasks([spec(f"t{i:02d}") for i in range(n)], time.time())
    return Engine(store, home, config(max_concurrent=4), headroom=plenty, host="quiet")


async def _drain(engine: Engine, store: SqliteStore) -> None:
    """Run ``engine`` until every task in ``store`` is done, then stop it."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.run)
        with anyio.fail_after(60):
            while any(t.status != S.DONE for t in store.list_tasks()):
                await anyio.sleep(0.05)
        await engine.shutdown(leave_running=False)
        tg.cancel_scope.cancel()


# -- the idle engine ---------------------------------------------------------------------------
async def _settle(store: CountingStore, quiet_s: float = 1.5, limit_s: float = 60.0) -> None:
    """Until no read happened for ``quiet_s`` (the engine's start-up reads are over)."""
    deadline = time.monotonic() + limit_s
    last, since = store.total(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, f"the engine never went quiet: {store.reads}"
        await anyio.sleep(0.1)
        if store.total() != last:
            last, since = store.total(), time.monotonic()


async def test_an_idle_engine_reads_nothing_until_something_changes(
    tmp_path: Path, stores: Callable[[], SqliteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    counting = CountingStore(stores())
    writer = stores()  # another connection: what another process's commit looks like
    # tasks that cannot start here (a tag this host lacks), one behind a dependency
    writer.add_tasks([spec(f"gpu{i}", requires=("gpu",)) for i in range(50)], time.time())
    writer.add_tasks([spec("later", depends_on=("gpu0",))], time.time())
    engine = Engine(counting, home, config(), headroom=plenty, host="quiet")

    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.run)
        with anyio.fail_after(60):
            while (t := writer.get_task("later")) is None or t.waiting != "after gpu0":
                await anyio.sleep(0.05)
        await _settle(counting)
        before = dict(counting.reads)
        handovers: list[str] = []
        run_sync = anyio.to_thread.run_sync

        async def counted(fn: Any, *args: Any, **kw: Any) -> Any:
            handovers.append(getattr(fn, "__qualname__", repr(fn)))
            return await run_sync(fn, *args, **kw)

        monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
        await anyio.sleep(5.0)  # idle: nothing changes anywhere
        monkeypatch.undo()
        assert dict(counting.reads) == before, (
            f"an idle engine read the store: {dict(counting.reads)} vs {before}"
        )
        # a second of an idle engine (a 1 s heartbeat here): one hand-over for the housekeeping
        # tick's reads, one for the snapshot, one for the heartbeat and the host's row (there
        # were seven: the file check, the config file, the headroom, the agents' memory and the
        # snapshot's figures each had one of their own, and the wait for a change took a worker
        # thread for each second; it is now woken through the loop)
        assert len(handovers) <= 3 * 5 + 3, handovers

        # another process adds a task: the engine wakes, reads what changed, and plans it
        writer.add_tasks([spec("new", requires=("gpu",))], time.time())
        with anyio.fail_after(30):
            while (t := writer.get_task("new")) is None or t.waiting != "needs tags: gpu":
                await anyio.sleep(0.05)
        assert counting.total() > sum(before.values())
        assert counting.reads["dependencies"] == 0  # one batch query, never one per task
        assert counting.reads["list_tasks"] <= 3, counting.reads  # the queue is not re-listed per change
        await engine.shutdown(leave_running=False)
        tg.cancel_scope.cancel()


async def test_a_change_by_another_process_wakes_the_engine_at_once(
    tmp_path: Path, stores: Callable[[], SqliteStore]
) -> None:
    """No poll: a task added by another connection starts (and finishes) without any local wake."""
    home = tmp_path / "home"
    home.mkdir()
    engine = Engine(stores(), home, config(), headroom=plenty, host="quiet")
    writer = stores()
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.run)
        await engine._started.wait()
        writer.add_tasks([spec("from-outside")], time.time())
        with anyio.fail_after(60):
            while (t := writer.get_task("from-outside")) is None or t.status != S.DONE:
                await anyio.sleep(0.05)
        await engine.shutdown(leave_running=False)
        tg.cancel_scope.cancel()


async def test_the_engine_counts_its_slots_on_its_own_loop_only(
    tmp_path: Path, stores: Callable[[], SqliteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slots an engine's agents hold are counted by walking its runners, which its loop adds
    and removes: a plan on a worker thread that counted them itself could walk them mid-change
    ("dictionary changed size during iteration", seen ending an engine of a three-host test). The
    count is taken on the loop and handed over; it is never taken on another thread."""
    store = stores()
    engine = _engine(tmp_path, store, 24)
    counted_on: set[str] = set()
    count = Engine.slots_taken

    def slots_taken(self: Engine) -> int:
        counted_on.add(threading.current_thread().name)
        return count(self)

    monkeypatch.setattr(Engine, "slots_taken", slots_taken)
    await _drain(engine, store)
    assert engine.planner.reads >= 1  # plans that read the store ran on a worker thread
    assert counted_on == {threading.current_thread().name}, counted_on


# -- the store's change token ------------------------------------------------------------------
def test_the_change_token_moves_for_other_connections_only(stores: Callable[[], SqliteStore]) -> None:
    a, b = stores(), stores()
    t0 = a.change_token()
    a.set_setting("own", "write")
    assert a.wait_for_change(t0, 0.5) == t0  # our own commit: whoever wrote knows
    woke = threading.Event()

    def waiter() -> None:
        if a.wait_for_change(t0, 30.0) != t0:
            woke.set()

    th = threading.Thread(target=waiter)
    th.start()
    b.set_setting("other", "write")
    th.join(35)
    assert woke.is_set()


# -- the planner -------------------------------------------------------------------------------
def _planner(store: Any, running: int = 0, head: Callable[[], Headroom] = plenty, **cfg: Any) -> Planner:
    c = config(**cfg)
    return Planner(
        store,
        config=lambda: c,
        clock=time.time,
        tags=(),
        running=lambda: running,
        headroom=head,
        mem=MemoryModel(),
        midnight=midnight,
    )


def _chain(store: SqliteStore, n: int) -> list[str]:
    """Queue ``n`` tasks, each after the one before; their names in order."""
    names = [f"c{i:03d}" for i in range(n)]
    store.add_tasks([spec(x, depends_on=tuple(names[i - 1 : i])) for i, x in enumerate(names)], time.time())
    return names


def test_a_plan_without_a_change_reads_nothing_and_decides_nothing(stores: Callable[[], SqliteStore]) -> None:
    inner = stores()
    counting = CountingStore(inner)
    inner.add_tasks([spec(f"t{i}", requires=("gpu",)) for i in range(200)], time.time())
    p = _planner(counting)
    first = p.plan()
    assert [d.reason for _, d in first] == ["needs tags: gpu"] * 200
    reads = counting.total()
    again = p.plan()
    assert again is first and counting.total() == reads and p.reads == 1


def test_a_change_elsewhere_refetches_only_the_tasks_that_moved(stores: Callable[[], SqliteStore]) -> None:
    inner, writer = stores(), stores()
    counting = CountingStore(inner)
    inner.add_tasks([spec(f"t{i}", requires=("gpu",)) for i in range(200)], time.time())
    p = _planner(counting)
    p.plan()
    token = p.token
    assert token is not None
    counting.reads.clear()
    writer.add_tasks([spec("extra")], time.time())
    inner.wait_for_change(token, 30.0)
    decisions = p.plan()
    assert {t.name: d.ok for t, d in decisions}["extra"] is True
    # SQLite's change counter: just the task that changed, and its dependencies
    assert counting.reads["list_tasks"] == 0 and counting.reads["queued_stamps"] == 0, counting.reads
    assert counting.reads["tasks_changed_since"] == 1 and counting.reads["unfinished_dependencies"] == 1
    assert counting.changed == [1]  # tasks the store returned as changed


def test_a_freed_slot_is_planned_from_memory(stores: Callable[[], SqliteStore]) -> None:
    """An agent's end frees a slot without a store change: the engine plans it on its loop,
    from what the planner read (no store read between an agent's end and the next start)."""
    inner = stores()
    counting = CountingStore(inner)
    inner.add_tasks([spec(f"t{i}") for i in range(5)], time.time())
    running = [2]
    c = config(max_concurrent=2)
    p = Planner(
        counting, config=lambda: c, clock=time.time, tags=(), running=lambda: running[0],
        headroom=plenty, mem=MemoryModel(), midnight=midnight,
    )  # fmt: skip
    full = p.plan(admitting=True)
    assert not any(d.ok for _, d in full) and p.reads == 1
    reads = counting.total()
    running[0] = 1  # an agent ended
    freed = p.plan_from_memory(admitting=True)
    assert freed is not None and [t.name for t, d in freed if d.ok] == ["t0"]
    assert counting.total() == reads and p.reads == 1
    p.invalidate()  # something changed here: that plan must read
    assert p.plan_from_memory(admitting=True) is None
    p.plan(admitting=True)
    # another thread planning holds the planner: the loop does not wait for it
    held = threading.Event()
    release = threading.Event()

    def planning() -> None:
        with p._lock:  # what ``plan`` holds while it reads
            held.set()
            release.wait(30)

    th = threading.Thread(target=planning)
    th.start()
    assert held.wait(30)
    try:
        assert p.plan_from_memory(admitting=True) is None
    finally:
        release.set()
        th.join(30)
    assert p.plan_from_memory(admitting=True) is not None


@pytest.mark.parametrize("counters", [True, False], ids=["change-counter", "stamps"])
def test_a_refused_claim_leaves_the_task_known(stores: Callable[[], SqliteStore], counters: bool) -> None:
    """A task being claimed is left out of the decisions; when its claim is refused (another
    engine took it, or its claim conditions no longer held) and nothing in the store changed,
    the planner still knows it: it was never dropped (the multi-host drain lost such tasks)."""
    inner = stores()
    store = CountingStore(inner) if counters else NoCounterStore(inner)
    inner.add_tasks([spec("t0"), spec("t1")], time.time())
    p = _planner(store)
    assert [t.name for t, d in p.plan(admitting=True) if d.ok] == ["t0", "t1"]
    first = p.plan(admitting=True)[0][0]
    p.claiming(first.id)
    assert [t.name for t, _ in p.plan_from_memory(admitting=True) or []] == ["t1"]
    p.unclaimed(first.id)
    assert [t.name for t, d in p.plan(admitting=True) if d.ok] == ["t0", "t1"]
    p.claiming(first.id)
    p.claimed(first.id)  # taken: gone from the queue
    assert [t.name for t, _ in p.plan(admitting=True)] == ["t1"]


def test_a_recorded_cost_makes_a_daily_budget_read_the_spend_again(stores: Callable[[], SqliteStore]) -> None:
    inner = stores()
    inner.add_tasks([spec("t0")], time.time())
    plain, budgeted = _planner(inner), _planner(inner, budget_usd_daily=5.0)
    for p in (plain, budgeted):
        p.plan()
        assert not p.needs_read()
        p.spent()
    assert not plain.needs_read()  # no budget: the spend is never read
    assert budgeted.needs_read()


class NoCounterStore(CountingStore):
    """A store that cannot tell what changed (as PostgreSQL's ``tasks_changed_since``)."""

    def tasks_changed_since(self, marker: int | None) -> TaskChanges:
        with self._lock:
            self.reads["tasks_changed_since"] += 1
        return TaskChanges(0, tuple(self.inner.list_tasks()), full=True, incremental=False)


def test_without_change_counters_the_planner_compares_stamps(stores: Callable[[], SqliteStore]) -> None:
    inner, writer = stores(), stores()
    counting = NoCounterStore(inner)
    _chain(inner, 100)
    p = _planner(counting)
    decisions = {t.name: d for t, d in p.plan()}
    assert decisions["c000"].ok and decisions["c001"].reason == "after c000"
    token = p.token
    assert token is not None
    counting.reads.clear()
    writer.add_tasks([spec("extra")], time.time())
    inner.wait_for_change(token, 30.0)
    decisions = {t.name: d for t, d in p.plan()}
    assert decisions["extra"].ok and decisions["c002"].reason == "after c001"
    # asked once whether the store can tell what changed; after that, stamps and one fetch
    assert counting.reads["tasks_changed_since"] == 0 and counting.reads["queued_stamps"] == 1
    assert counting.reads["get_task"] == 1 and counting.reads["list_tasks"] == 0, counting.reads


def test_a_long_chain_is_planned_from_the_changes_alone(stores: Callable[[], SqliteStore]) -> None:
    """Each step of a chain reads the few tasks that moved, never the whole queue again, and the
    decisions stay those of a planner that reads everything afresh."""
    inner = stores()
    counting = CountingStore(inner)
    names = _chain(inner, 120)
    p = _planner(counting)
    for step in range(5):
        decisions = p.plan()
        fresh = _planner(inner).plan()
        assert [(t.id, d) for t, d in decisions] == [(t.id, d) for t, d in fresh]
        assert [t.name for t, d in decisions if d.ok] == [names[step]]
        got = inner.claim("e1", "h", (), time.time(), 60.0, "shell", None)
        assert got is not None and got.name == names[step]
        p.claimed(got.id)
        inner.transition(
            got.id, S.DONE, reason="ok", now=time.time(), owner="e1", attempt=got.attempt, expect=[S.RUNNING]
        )
        p.invalidate()
        counting.changed.clear()
    p.plan()
    assert max(counting.changed) <= 2  # the finished task and the one it released
    assert counting.reads["list_tasks"] == 0 and counting.reads["queued_stamps"] == 0


def test_dependencies_are_one_batch_query_and_follow_changes(stores: Callable[[], SqliteStore]) -> None:
    inner = stores()
    counting = CountingStore(inner)
    _chain(inner, 300)
    p = _planner(counting)
    decisions = {t.name: d for t, d in p.plan()}
    assert decisions["c000"].ok and decisions["c001"].reason == "after c000"
    assert counting.reads["dependencies"] == 0 and counting.reads["unfinished_dependencies"] == 1
    # the engine claims and finishes c000 through this same connection: it invalidates
    got = inner.claim("e1", "h", (), time.time(), 60.0, "shell", None)
    assert got is not None and got.name == "c000"
    inner.transition(
        got.id, S.DONE, reason="ok", now=time.time(), owner="e1", attempt=got.attempt, expect=[S.RUNNING]
    )
    assert "c000" in {t.name for t, _ in p.plan()}  # not invalidated: the plan it holds
    p.invalidate()
    decisions = {t.name: d for t, d in p.plan()}
    assert "c000" not in decisions and decisions["c001"].ok and decisions["c002"].reason == "after c001"


class WalkedTasks(tuple[Task, ...]):
    """A snapshot's tasks that count the walks over them."""

    walks = 0

    def __iter__(self) -> Iterator[Task]:
        type(self).walks += 1
        return super().__iter__()


def test_a_runners_question_check_does_not_walk_the_queue(
    stores: Callable[[], SqliteStore], tmp_path: Path
) -> None:
    """Every runner asks on every poll whether its task waits on a person (a stall does not count
    then): the answer comes from the ids gathered once per snapshot, not from a walk over every
    task of the queue on each ask."""
    store = stores()
    store.add_tasks([TaskSpec(name=f"t{i:03d}", prompt="x") for i in range(300)], time.time())
    tasks = store.list_tasks()
    engine = Engine(store, tmp_path, config())
    asked = replace(tasks[7], asking=True)
    snap = Snapshot(taken_at=time.time(), tasks=WalkedTasks([*tasks[:7], asked, *tasks[8:]]))
    engine._snapshot = snap
    WalkedTasks.walks = 0
    for _ in range(100):
        assert engine._asking(asked.id) and not engine._asking(tasks[8].id)
    assert WalkedTasks.walks == 1
    engine._snapshot = replace(snap, tasks=WalkedTasks(tasks))  # a new snapshot: asked again
    assert not engine._asking(asked.id) and WalkedTasks.walks == 2


def test_the_next_time_based_gate_is_a_deadline(stores: Callable[[], SqliteStore]) -> None:
    inner = stores()
    inner.add_tasks([spec("backoff")], time.time())
    later = time.time() + 3600
    got = inner.claim("e1", "h", (), time.time(), 60.0, "shell", None)
    assert got is not None
    inner.transition(
        got.id, S.QUEUED, reason="retry", now=time.time(), owner="e1", attempt=got.attempt, not_before=later
    )
    p = _planner(inner)
    (only,) = p.plan()
    assert only[1].reason is not None and only[1].reason.startswith("waits until ")
    assert p.next_at() == pytest.approx(later)


def test_waiting_reasons_are_rewritten_only_when_this_planner_changes_them(
    stores: Callable[[], SqliteStore],
) -> None:
    inner = stores()
    inner.add_tasks([spec("a", requires=("gpu",))], time.time())
    p = _planner(inner)
    decisions = p.plan()
    changes = p.waiting_changes(decisions)
    assert changes == {decisions[0][0].id: "needs tags: gpu"}
    inner.set_waiting(changes)
    p.recorded(changes)
    inner.set_waiting({decisions[0][0].id: "something another engine wrote"})
    p.invalidate()
    assert p.waiting_changes(p.plan()) == {}  # no ping-pong between engines


def test_a_reason_whose_figures_alone_moved_is_rewritten_at_most_every_so_often(
    stores: Callable[[], SqliteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue held by the memory gate: its reasons say how much memory is free, which moves all
    the time. A new figure alone is recorded again once per ``FIGURES_EVERY_S``; another wait at
    once."""
    from fleet_tui.scheduler import planner as planner_mod

    inner = stores()
    inner.add_tasks([spec("a")], time.time())
    p = _planner(inner)
    ((task, _),) = p.plan()
    clock = [1000.0]
    monkeypatch.setattr(planner_mod.time, "monotonic", lambda: clock[0])

    def held(why: str) -> list[tuple[Task, Decision]]:
        return [(task, Decision(False, why))]

    first = p.waiting_changes(held("memory: 22.9 GiB free < 1000.0 GiB floor"))
    assert first == {task.id: "memory: 22.9 GiB free < 1000.0 GiB floor"}
    p.recorded(first)
    clock[0] += 5
    assert p.waiting_changes(held("memory: 22.8 GiB free < 1000.0 GiB floor")) == {}
    assert p.waiting_changes(held("disk: 0.2 GiB free < 1.0 GiB floor")) == {
        task.id: "disk: 0.2 GiB free < 1.0 GiB floor"
    }
    clock[0] += planner_mod.FIGURES_EVERY_S
    assert p.waiting_changes(held("memory: 22.7 GiB free < 1000.0 GiB floor")) == {
        task.id: "memory: 22.7 GiB free < 1000.0 GiB floor"
    }


def test_headroom_far_below_a_floor_plans_again_only_once_in_a_while() -> None:
    """Far below the memory or disk floor nothing starts whatever the byte: a new reading plans
    again once per ``FIGURES_EVERY_S`` (every byte did, and re-planned a 10,000-task queue)."""
    from fleet_tui.scheduler.planner import FIGURES_EVERY_S

    cfg = gate_config(config(mem_floor_gib=1000.0))
    low = Headroom(cores=2, load_per_core=0.5, mem_available=22 * GIB, disk_free=500 * GIB, taken_at=NOW)
    moved = replace(low, mem_available=21 * GIB, taken_at=NOW + 1)
    later = replace(low, taken_at=NOW + FIGURES_EVERY_S)
    assert headroom_key(low, cfg, GIB, 4) == headroom_key(moved, cfg, GIB, 4)
    assert headroom_key(low, cfg, GIB, 4) != headroom_key(later, cfg, GIB, 4)


def test_a_pick_decides_the_head_of_the_queue_only(stores: Callable[[], SqliteStore]) -> None:
    """The engine's pick for its free slots decides the queue up to the tasks it picks, not the
    whole queue (at every start, a 10,000-task queue was walked three times: 44 starts a second
    here, 155 since), and picks what a whole plan would admit: holds, missing tags and backoffs
    ahead of the picks are decided and said, in claim order."""
    inner = stores()
    inner.add_tasks([spec("a0", requires=("gpu",))], NOW - 20)
    inner.add_tasks([spec("z", requires=("gpu",)), spec("a1", depends_on=["z"])], NOW - 10)
    inner.add_tasks([spec(f"t{i:04d}") for i in range(2000)], NOW)
    first = next(t for t in inner.list_tasks() if t.name == "t0000")
    backoff = inner.claim("e1", "h", (), NOW, 60.0, "shell", None, only_task=first.id)
    assert backoff is not None
    inner.transition(
        backoff.id, S.QUEUED, reason="retry", now=NOW, owner="e1", attempt=backoff.attempt,
        not_before=NOW + 3600,
    )  # fmt: skip
    c = config(max_concurrent=4)
    p = Planner(
        inner, config=lambda: c, clock=lambda: NOW, tags=(), running=lambda: 1,
        headroom=plenty, mem=MemoryModel(), midnight=midnight,
    )  # fmt: skip
    assert p.admit(3, 1) is None  # nothing read yet: from memory it cannot answer
    got = p.admit(3, 1, wait=True)
    assert got is not None and not got.whole
    assert [t.name for t in got.picked] == ["t0001", "t0002", "t0003"]
    reasons = {t.name: d.reason for t, d in got.head}
    assert len(got.head) == 7 and reasons["a0"] == reasons["z"] == "needs tags: gpu"
    assert reasons["a1"] == "after z" and (reasons["t0000"] or "").startswith("waits until ")
    whole = p.plan(admitting=True, running=1)
    assert whole[: len(got.head)] == got.head  # the same decisions as the whole plan's
    assert [t for t, d in whole if d.ok][:3] == list(got.picked)
    assert p.admit(3, 1) is got  # nothing moved: the same pick, decided nothing
    assert p.next_at() == pytest.approx(NOW + 3600)
    for t in got.picked:
        p.claiming(t.id)
    p.claimed(got.picked[0].id)
    again = p.admit(1, 3)
    assert again is not None and [t.name for t in again.picked] == ["t0004"]  # from memory
    # nothing may start (the fleet is paused): the head is the whole queue, each one said why
    inner.set_setting("fleet_paused", "1")
    paused = _planner(inner).admit(4, 0, wait=True)
    assert paused is not None and paused.whole and not paused.picked and len(paused.head) == 2003
    assert {d.reason for _, d in paused.head} >= {"fleet paused", "after z"}


async def test_the_reasons_behind_a_pick_are_written_within_a_second(
    tmp_path: Path, stores: Callable[[], SqliteStore]
) -> None:
    """A start decides the head of the queue; the tasks behind it get their reasons from a whole
    plan made at most once a second, so ``status`` and the cockpit still say why each waits.
    No pick decides more than the slots it fills."""
    store = stores()
    home = tmp_path / "home"
    home.mkdir()
    store.add_tasks([spec(f"t{i:03d}", command="sleep 60") for i in range(60)], time.time())
    engine = Engine(store, home, config(max_concurrent=4), headroom=plenty, host="quiet")
    heads: list[int] = []
    admit = engine.planner.admit

    def counted(free: int, running: int, *, wait: bool = False) -> Any:
        got = admit(free, running, wait=wait)
        if got is not None:
            heads.append(len(got.head))
        return got

    engine.planner.admit = counted  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.run)
        with anyio.fail_after(60):
            while True:
                tasks = store.list_tasks()
                running = [t for t in tasks if t.status == S.RUNNING]
                waiting = {t.waiting for t in tasks if t.status == S.QUEUED}
                if len(running) == 4 and waiting == {"slots full: 4/4 running"}:
                    break
                await anyio.sleep(0.05)
        await engine.shutdown(leave_running=False)
        tg.cancel_scope.cancel()
    assert heads and max(heads) <= 4, heads


def test_headroom_far_from_the_floors_reads_as_plenty() -> None:
    cfg = gate_config(config())
    far = Headroom(cores=2, load_per_core=0.5, mem_available=64 * GIB, disk_free=500 * GIB, taken_at=NOW)
    moved = Headroom(cores=2, load_per_core=0.5, mem_available=63 * GIB, disk_free=499 * GIB, taken_at=NOW)
    assert headroom_key(far, cfg, GIB, 4) == headroom_key(moved, cfg, GIB, 4)
    near = Headroom(cores=2, load_per_core=0.5, mem_available=3 * GIB, disk_free=500 * GIB, taken_at=NOW)
    nearer = Headroom(
        cores=2, load_per_core=0.5, mem_available=3 * GIB - 1, disk_free=500 * GIB, taken_at=NOW
    )
    assert headroom_key(near, cfg, GIB, 0) != headroom_key(nearer, cfg, GIB, 0)  # every byte counts there


# -- progress on a busy machine ----------------------------------------------------------------
def _task(name: str = "t") -> Task:
    return Task(id=f"id-{name}", spec=TaskSpec(name=name, prompt="p"), status=S.QUEUED, created_at=NOW)


def _inputs(running: int = 0, load: float = 5.0, cores: int = 2, own: float = 0.0) -> GateInputs:
    hr = Headroom(cores=cores, load_per_core=load, mem_available=64 * GIB, disk_free=500 * GIB, taken_at=NOW)
    return GateInputs(paused=False, running=running, headroom=hr, now=NOW, own_load=own)


def test_the_load_gate_never_stops_the_first_agent() -> None:
    cfg = GateConfig(max_concurrent=4)
    assert decide(_task(), "shell", cfg, _inputs(running=0, load=9.0), MemoryModel()) == Decision(True)
    held = decide(_task(), "shell", cfg, _inputs(running=1, load=9.0), MemoryModel())
    assert held.reason == "load 9.0/core > 2.0: one agent at a time until it drops"
    # plan: the first starts, the second and later say the load holds them back
    out = plan(
        [_task(f"t{i}") for i in range(3)],
        cfg,
        _inputs(running=0, load=9.0),
        MemoryModel(),
        default_coder="shell",
    )
    assert [d.ok for _, d in out] == [True, False, False]
    assert all((d.reason or "").startswith("load 9.0/core > 2.0") for _, d in out[1:])


def test_memory_and_disk_still_hold_the_first_agent() -> None:
    cfg = GateConfig(max_concurrent=4)
    hr = Headroom(cores=2, load_per_core=9.0, mem_available=1 * GIB, disk_free=500 * GIB, taken_at=NOW)
    d = decide(
        _task(), "shell", cfg, GateInputs(paused=False, running=0, headroom=hr, now=NOW), MemoryModel()
    )
    assert (d.reason or "").startswith("memory: ")
    hr = Headroom(cores=2, load_per_core=None, mem_available=64 * GIB, disk_free=500 * GIB, taken_at=NOW)
    d = decide(
        _task(), "shell", cfg, GateInputs(paused=False, running=0, headroom=hr, now=NOW), MemoryModel()
    )
    assert d.reason == "load reading unknown"  # an unknown reading is never plenty


def test_the_fleets_own_agents_are_taken_off_the_load() -> None:
    hr = Headroom(cores=2, load_per_core=2.5, mem_available=None, disk_free=None, taken_at=NOW)
    assert effective_load(hr, 0.0) == 2.5
    assert effective_load(hr, 2.0) == pytest.approx(1.5)  # (5.0 - 2) / 2 cores
    assert effective_load(hr, 10.0) == 0.0
    cfg = GateConfig(max_concurrent=4)
    # two agents of ours keep the load at 2.5/core: by itself the machine is at 1.5, under 2.0
    assert decide(_task(), "shell", cfg, _inputs(running=2, load=2.5, own=2.0), MemoryModel()).ok


def test_a_plan_is_settled_only_when_nothing_clears_by_itself() -> None:
    t = _task()
    assert settled([(t, Decision(True))], NOW, None) == (False, False)
    assert settled([(t, Decision(False, "load 3.0/core > 2.0: one agent at a time"))], NOW, None) == (
        False,
        False,
    )
    assert settled([(t, Decision(False, "needs tags: gpu"))], NOW, None) == (True, False)
    waits = [(t, Decision(False, "waits until 14:05", NOW + 600))]
    assert settled(waits, NOW, None) == (False, False)  # sat out
    assert settled(waits, NOW, 60.0) == (True, True)  # longer than --max-wait: left


def test_a_store_command_does_not_load_the_event_loop_machinery() -> None:
    # `fleet-tui status`, `add`... open a store and wait for nothing: asyncio is ~15 ms of
    # import they need not pay (the change wait loads it only under a running loop)
    code = "import sys, fleet_tui.scheduler.store.changes, fleet_tui.scheduler.store.sqlite_store; "
    code += "print('asyncio' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


async def test_an_agents_end_that_nothing_waits_on_is_planned_without_a_store_read(
    tmp_path: Path, stores: Callable[[], SqliteStore]
) -> None:
    """24 independent tasks at concurrency 4: each agent's end frees a slot and writes its
    task's verdict, but no queued task waits on it, so the next start is planned from what the
    planner holds. The store's queue is read at the start, not once per agent (it was: 24+)."""
    store = stores()
    engine = _engine(tmp_path, store, 24)
    await _drain(engine, store)
    assert engine.planner.reads <= 3, engine.planner.reads


def test_an_ended_task_asks_for_a_read_only_when_something_waits_on_it(
    stores: Callable[[], SqliteStore],
) -> None:
    """``affected_by``: a task queued again, or one a queued task waits on, needs the store
    read again; an ended task nothing waits on does not. The holds stay right as dependents
    come and go."""
    inner = stores()
    inner.add_tasks([spec("a"), spec("b", depends_on=["a"]), spec("c")], NOW)
    c = config(max_concurrent=4)
    p = Planner(
        inner, config=lambda: c, clock=lambda: NOW, tags=(), running=lambda: 0,
        headroom=plenty, mem=MemoryModel(), midnight=midnight,
    )  # fmt: skip
    decided = {t.name: d for t, d in p.plan(admitting=True)}
    assert decided["b"].reason == "after a" and decided["a"].ok and decided["c"].ok
    tasks = {t.name: t for t in inner.list_tasks()}
    ended = {n: replace(tasks[n], status=S.DONE) for n in "ac"}
    for n in "ac":
        p.claimed(tasks[n].id)
    assert p.affected_by(ended["a"])  # b waits on it
    assert not p.affected_by(ended["c"])  # nothing waits on c
    assert p.affected_by(replace(tasks["c"], status=S.QUEUED))  # c queued again
    assert p.affected_by(replace(tasks["b"], status=S.CANCELLED))  # b was in the queue
    # b leaves the queue (cancelled elsewhere): nothing waits on a any more
    inner.update_task(tasks["b"].id, status=S.CANCELLED)
    p.invalidate()
    p.plan(admitting=True)
    assert not p.affected_by(ended["a"])


async def test_short_hand_overs_take_one_thread_at_a_time(
    tmp_path: Path, stores: Callable[[], SqliteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Starts in place and verdicts with nothing to verify go through the engine's one lane: four
    agents that end together no longer make four threads share the interpreter with the loop.
    A task with a worktree, or with verifiers, keeps the shared pool (its setup or its verifiers
    may run for minutes). The first starts are held a little so that overlaps, if allowed, are
    certain to show."""
    from fleet_tui.scheduler.attempts.finish import Reaper
    from fleet_tui.scheduler.attempts.launch import Launcher

    store = stores()
    engine = _engine(tmp_path, store, 12)
    lock = threading.Lock()
    inside = [0]
    most = [0]
    calls = [0]

    def counted(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kw: Any) -> Any:
            with lock:
                inside[0] += 1
                calls[0] += 1
                most[0] = max(most[0], inside[0])
                first = calls[0] <= 4
            try:
                if first:
                    time.sleep(0.05)  # widen the window: concurrent callers would overlap here
                return fn(*args, **kw)
            finally:
                with lock:
                    inside[0] -= 1

        return wrapper

    monkeypatch.setattr(Launcher, "prepare", counted(Launcher.prepare))
    monkeypatch.setattr(Reaper, "settle", counted(Reaper.settle))
    await _drain(engine, store)
    assert calls[0] == 24 and most[0] == 1, (calls, most)
    worktree = replace(store.list_tasks()[0], spec=spec("w", git_ref="main"))
    verified = replace(store.list_tasks()[0], spec=spec("v", verify=["true"]))
    assert engine._lane_for(worktree) is None and engine._lane_for(worktree, verdict=True) is None
    assert engine._lane_for(verified) is engine.lane and engine._lane_for(verified, verdict=True) is None


async def test_a_quiet_engine_reads_the_machine_one_tick_in_five_until_a_task_is_queued(
    tmp_path: Path, stores: Callable[[], SqliteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing running, starting or queued here (and no other engine's agents), the
    housekeeping tick that reads the machine's headroom runs one time in ``QUIET_TICKS``; a task
    queued here ends the quiet: the gate wants fresh readings again, every tick."""
    monkeypatch.setattr(engine_mod, "HOUSEKEEPING_S", 0.02)  # the ticks come faster, not fewer
    home = tmp_path / "home"
    home.mkdir()
    reads: list[float] = []

    def headroom() -> Headroom:
        reads.append(time.monotonic())
        return plenty()

    engine = Engine(stores(), home, config(), headroom=headroom, host="quiet")
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.run)
        with anyio.fail_after(60):
            while engine.quiet_ticks < 40:
                await anyio.sleep(0.01)
        # a read, then four ticks left out, and so on (a few reads before the engine was quiet)
        skipped, n = engine.quiet_ticks, len(reads)
        assert skipped // (engine_mod.QUIET_TICKS - 1) - 1 <= n <= skipped // (engine_mod.QUIET_TICKS - 1) + 5

        stores().add_tasks([spec("gpu", requires=("gpu",))], time.time())  # queued, cannot start here
        with anyio.fail_after(60):
            while engine.planner.queued() != 1:
                await anyio.sleep(0.01)
            skipped, n = engine.quiet_ticks, len(reads)
            while len(reads) < n + 12:
                await anyio.sleep(0.01)
        assert engine.quiet_ticks - skipped <= engine_mod.QUIET_TICKS - 1  # at most the run in progress
        await engine.shutdown(leave_running=False)
        tg.cancel_scope.cancel()


async def test_a_snapshot_read_while_a_task_moved_never_hands_on_the_version_before(
    tmp_path: Path, stores: Callable[[], SqliteStore]
) -> None:
    """The snapshot is read on a worker thread while the loop goes on. A task that moved (and was
    published) in the middle of that read may come back in its version before the move; handed
    on, it undid the move already published: a run's log printed ``done -> running`` for a task
    that ran once. The published version wins until the next read."""
    home = tmp_path / "home"
    home.mkdir()
    store = stores()
    (task,) = store.add_tasks([spec("once")], time.time())
    read, go = threading.Event(), threading.Event()

    class SlowRead:
        """The store, with the snapshot's task read held just after it read."""

        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        def tasks_changed_since(self, marker: int | None) -> TaskChanges:
            out = store.tasks_changed_since(marker)
            if not read.is_set():
                read.set()
                go.wait(30)
            return out

    engine = Engine(SlowRead(), home, config(), headroom=plenty, host="quiet")
    seen: list[tuple[str, S]] = []
    publish = engine.bus.publish

    def record(items: Any) -> None:
        seen.extend((ev.task.name, ev.task.status) for ev in items if isinstance(ev, TaskChanged))
        publish(items)

    engine.bus.publish = record  # type: ignore[method-assign]
    engine.generation += 1  # a build is due
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine._refresh_snapshot)
        await anyio.to_thread.run_sync(read.wait, 30)  # the read holds the task as queued
        moved = store.transition(task.id, S.CANCELLED, reason="by hand", now=time.time())
        assert moved is not None
        engine.publish_task(moved)
        go.set()
    assert seen[0] == ("once", S.CANCELLED), seen
    assert ("once", S.QUEUED) not in seen[1:], f"the version before the move came after it: {seen}"
    assert [t.status for t in engine.snapshot().tasks] == [S.CANCELLED]
    # the next build reads the store again (the publication moved the generation)
    await engine._refresh_snapshot()
    assert [t.status for t in engine.snapshot().tasks] == [S.CANCELLED]
    assert engine._published == {}
