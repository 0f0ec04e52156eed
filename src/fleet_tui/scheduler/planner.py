"""Planning in proportion to change: which queued tasks may start here, and when to look again.

The engine used to list every queued task and ask the store for each one's dependencies on every
wake-up (and at least once a second), so a 10,000-task queue that could not start kept a core
busy and a long chain crawled. The ``Planner`` keeps what it read and reads again only what
moved:

* the queue: ``tasks_changed_since`` (SQLite's change counter) returns just the tasks that
  changed since the last read, and the queue is kept in claim order as they come and go (never
  sorted whole again); a store without counters (PostgreSQL) is compared by ``queued_stamps()``
  (one light query) and only the tasks whose stamp moved are fetched again;
* dependencies: one batch query (``unfinished_dependencies``) per read, never one per task, and
  only for the tasks that changed and their dependents when the store can tell which;
* pause flag and rate limits: one query each per read; today's spend only with a daily budget.

So a 1500-task chain costs a few small queries per step, not a walk of the whole queue.

It reads the store only when the store's change token moved (another process committed), when
the engine said something changed here (``invalidate``), or when the day turned (the budget).
Between reads the decisions themselves are kept too, and computed again only when an input
changed: the number of running agents, the config, the machine's headroom as the reasons show
it, or the clock passed the earliest time-based gate (``next_at``: a backoff's ``not_before``,
a rate-limit reset, the budget's new day). So an idle engine does no store reads at all.

A start decides only the head of the queue (``admit``): the tasks in claim order up to the ones
it picks for the free slots (the gate's ``decisions`` are lazy), so a start costs the same
behind 10,000 queued tasks as behind ten. The tasks behind the head wait behind slots now full;
their reasons come from a whole ``plan``, which the engine makes at most once a second while
starts go on (``REASONS_EVERY_S``).

The Planner is synchronous (store calls): the engine calls it through ``anyio.to_thread``. It
takes what it needs as values and callables, never the Engine. The one input that is the
engine's own mutable state, how many slots its agents hold, is counted on the engine's loop and
handed to ``plan`` as a number: counted on the planning thread, it walked the engine's runners
while the loop added and removed them.
"""

from __future__ import annotations

import re
import threading
import time
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fleet_tui.coders.base import account_of
from fleet_tui.config import Config
from fleet_tui.scheduler.model import Decision, RateLimit, Task
from fleet_tui.scheduler.policy.gate import GateConfig, GateInputs, claim_order, decisions
from fleet_tui.scheduler.policy.headroom import GIB, Headroom, MemoryModel
from fleet_tui.scheduler.states import TaskStatus
from fleet_tui.scheduler.store.protocol import Store, TaskChanges

#: gate reasons that clear by themselves as agents finish
#: how often waiting reasons whose figures alone moved are recorded again (``waiting_changes``)
FIGURES_EVERY_S = 120.0
#: the figures of a waiting reason (``memory: 22.9 GiB free < 2.0 GiB floor``)
_FIGURES = re.compile(r"\d+(\.\d+)?")


def same_wait(a: str | None, b: str | None) -> bool:
    """Two waiting reasons that say the same but for their figures (a gate's reading that moved:
    "memory: 22.9 GiB free" then "22.8"): the planner rewrites such a change rarely, and
    ``run`` prints it once."""
    if a is None or b is None:
        return a is b
    return _FIGURES.sub("#", a) == _FIGURES.sub("#", b)


TRANSIENT_GATES = ("load ", "load reading", "memory", "disk", "slots full")

#: above this many changed queued tasks, one listing of the queue beats fetching them one by one
REFETCH_ONE_BY_ONE = 64

Plan = list[tuple[Task, Decision]]


def gate_config(c: Config) -> GateConfig:
    """The gate's limits from the config."""
    return GateConfig(
        max_concurrent=c.max_concurrent,
        rate_limit_threshold=c.rate_limit_threshold,
        max_load_per_core=c.max_load_per_core,
        mem_floor_bytes=int(c.mem_floor_gib * GIB),
        disk_floor_bytes=int(c.disk_floor_gib * GIB),
        budget_usd_daily=c.budget_usd_daily,
    )


def headroom_key(h: Headroom | None, cfg: GateConfig, need: int, free_slots: int) -> tuple[Any, ...]:
    """The headroom as far as it can change a decision or a reason: the load as the reasons show
    it (to 0.01 per core; the kernel moves it every 5 s; not at all while no agent runs here,
    when the load gate lets the first one start anyway), memory and disk exactly when they are
    within 0.1 GiB of a floor (``need``: the largest agent's estimate, once per free slot), only
    "plenty" above, and "short" (once per ``FIGURES_EVERY_S``) far below. A reading that would
    change nothing does not plan again."""
    if h is None:
        return (None,)
    tenth = GIB // 10
    # far below a floor nothing starts, whatever the byte: the reasons' figures are read again
    # once per ``FIGURES_EVERY_S`` (a 10,000-task queue held by the memory gate was planned
    # whole again at every byte that moved: 8-19 % of a core beside another program's churn)
    short = ("short", int(h.taken_at // FIGURES_EVERY_S))
    mem: Any = h.mem_available
    if mem is not None and mem - need * (free_slots + 1) - cfg.mem_floor_bytes > tenth:
        mem = "plenty"
    elif mem is not None and mem - need - cfg.mem_floor_bytes < -tenth:
        mem = short
    disk: Any = h.disk_free
    if disk is not None and disk - cfg.disk_floor_bytes > tenth:
        disk = "plenty"
    elif disk is not None and disk - cfg.disk_floor_bytes < -tenth:
        disk = short
    load: Any = None if h.load_per_core is None else round(h.load_per_core, 2)
    if load is not None and free_slots >= cfg.max_concurrent:
        load = "first agent"  # none runs: the load gate lets the first one start whatever the load
    return (load, mem, disk, h.cores)


def _next_at(decisions: Plan, now: float) -> float | None:
    """The earliest time a time-based gate among ``decisions`` opens."""
    timed = [d.retry_at for _, d in decisions if not d.ok and d.retry_at is not None and d.retry_at > now]
    return min(timed) if timed else None


def settled(decisions: Plan, now: float, max_wait: float | None) -> tuple[bool, bool]:
    """(nothing in this plan can start without a person or an outside event, a time-based wait
    longer than ``max_wait`` was left). Headroom gates (load, memory, disk, slots) clear by
    themselves and time-based waits (a retry's backoff, a rate-limit reset, the budget's new
    day) end by themselves: a plan with either is not settled, unless the soonest wait is longer
    than ``max_wait`` (``run --until-idle --max-wait``)."""
    if any(d.ok or (d.reason or "").startswith(TRANSIENT_GATES) for _, d in decisions):
        return False, False
    timed = [d.retry_at for _, d in decisions if d.retry_at is not None and not d.ok]
    if timed:
        if max_wait is None or min(timed) - now <= max_wait:
            return False, False
        return True, True
    return True, False


@dataclass(frozen=True)
class QueueView:
    """What the planner read from the store, as of one change token (the queue itself and its
    holds are the planner's, kept in claim order as they change: no copy of them is made per
    read or per claim, which cost a walk of a 10,000-task queue at every start)."""

    paused: bool
    rate_limits: Mapping[str, tuple[RateLimit, float | None]]
    spent_today: float
    day: float
    generation: int = 0
    stamps: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    #: the coders the queued tasks name (None: the default coder), for the memory estimate
    coders: frozenset[str | None] = frozenset()
    #: today's spend was read (a daily budget is set)
    budgeted: bool = False


@dataclass(frozen=True)
class Admission:
    """The engine's pick for its free slots (``Planner.admit``): the tasks to start, in claim
    order, and the decisions on the head of the queue up to the last of them, whose waiting
    reasons the engine records. ``whole``: that head is the whole queue; else the reasons of the
    tasks behind it are left to the next whole ``plan`` (they wait behind slots now full)."""

    picked: tuple[Task, ...]
    head: Plan
    whole: bool


class Planner:
    """Admission decisions for one engine, computed again only when something they depend on
    changed. ``running`` counts this engine's live agents; ``headroom`` is its latest machine
    reading (None: none yet, the gate then reads one itself)."""

    def __init__(
        self,
        store: Store,
        *,
        config: Callable[[], Config],
        clock: Callable[[], float],
        tags: Sequence[str],
        running: Callable[[], int],
        headroom: Callable[[], Headroom],
        mem: MemoryModel,
        midnight: Callable[[float], float],
    ) -> None:
        self.store = store
        self._config = config
        self._clock = clock
        self._tags = tuple(tags)
        self._running = running
        self._headroom = headroom
        self._mem = mem
        self._midnight = midnight
        self._lock = threading.Lock()
        self._dirty = True
        self._token: int | None = None
        self._view: QueueView | None = None
        self._tasks: dict[str, Task] = {}
        self._order: list[tuple[tuple[float, float, str], Task]] = []
        self._coders: Counter[str | None] = Counter()
        self._held: dict[str, str] = {}
        #: what each held task waits on, and how many held tasks wait on each name: a task that
        #: ends here without being awaited changes no decision but its slot (``affected_by``)
        self._held_on: dict[str, tuple[str, ...]] = {}
        self._awaited: Counter[str] = Counter()
        self._rev: int | None = None
        self._incremental = True
        self._generation = 0
        self._last_key: tuple[Any, ...] | None = None
        self._last: Plan = []
        self._admit_key: tuple[Any, ...] | None = None
        self._admitted = Admission((), [], True)
        self._admit_next_at: float | None = None
        self._next_at: float | None = None
        self._written: dict[str, str | None] = {}
        #: when reasons were last recorded: one whose figures alone moved waits a while after it
        self._figures_at = -FIGURES_EVERY_S
        #: tasks this engine is claiming now: left out of the decisions until the claim is known
        #: (taken: ``claimed``; refused: ``unclaimed``, and they are planned again as they are)
        self._claiming: set[str] = set()
        #: how many times the store was read (for benchmarks and tests)
        self.reads = 0

    # -- what changed --------------------------------------------------------------------------
    def invalidate(self) -> None:
        """Something changed here (a task added, claimed, finished, a command): read again."""
        self._dirty = True

    def spent(self) -> None:
        """An attempt's cost was recorded: today's spend moved. Read again when it matters (a
        daily budget is set): a slot freed by an agent's end is otherwise planned from memory."""
        view = self._view
        if view is not None and view.budgeted:
            self._dirty = True

    def affected_by(self, task: Task) -> bool:
        """Whether ``task``, as this engine just wrote it, may change a decision beyond the
        slot it took or freed: it is queued (again), it was in the queue, or a queued task
        waits on its name. Else (an agent's task ended and nothing here waits on it, the common
        case) the next plan is made from memory, without a store read. While another thread
        reads the store (the holds it found may not be applied yet), the answer is yes. Never
        waits (the engine's loop asks)."""
        if task.status == TaskStatus.QUEUED:
            return True
        if not self._lock.acquire(blocking=False):
            return True
        try:
            return self._view is None or task.id in self._tasks or task.name in self._awaited
        finally:
            self._lock.release()

    def claiming(self, task_id: str) -> None:
        """This engine is claiming ``task_id`` (on a worker thread): leave it out of the next
        decisions. Never waits (the engine's loop calls it)."""
        self._claiming.add(task_id)

    def unclaimed(self, task_id: str) -> None:
        """The claim of ``task_id`` was refused (another engine took it, or it changed): it is
        in the queue as the planner knows it, and what changed is read at the next plan."""
        self._claiming.discard(task_id)
        self._dirty = True

    def claimed(self, task_id: str) -> None:
        """This engine claimed ``task_id``: it left the queue. Planned again from memory, without
        reading the store (its stamp is gone at the next read anyway)."""
        with self._lock:
            self._claiming.discard(task_id)
            view = self._view
            if view is None or task_id not in self._tasks:
                return
            self._drop(task_id)
            self._written.pop(task_id, None)
            self._generation += 1
            self._view = replace(view, generation=self._generation)

    def queued(self) -> int | None:
        """How many tasks are queued here as of the last read (None: not read yet)."""
        return len(self._tasks) if self._view is not None else None

    @property
    def token(self) -> int | None:
        """The store's change token as of the last read (wait on it for the next change)."""
        return self._token

    def next_at(self) -> float | None:
        """The earliest time a time-based gate of the last plan or pick opens (None: none waits
        on time)."""
        now = self._clock()  # one that passed was planned again at its time (or is stale)
        due = [t for t in (self._next_at, self._admit_next_at) if t is not None and t > now]
        return min(due) if due else None

    def gate_config(self) -> GateConfig:
        return gate_config(self._config())

    def headroom_key(self, h: Headroom | None, running: int | None = None) -> tuple[Any, ...]:
        """``headroom_key`` for this engine's queue and config (``running``: as for ``plan``)."""
        cfg = self._config()
        named = self._view.coders if self._view is not None else frozenset()
        coders = {c or cfg.default_coder for c in named}
        need = max((self._mem.estimate(c) for c in coders), default=0)
        taken = self._running() if running is None else running
        return headroom_key(h, gate_config(cfg), need, max(0, cfg.max_concurrent - taken))

    # -- reading -------------------------------------------------------------------------------
    def needs_read(self) -> bool:
        """Whether the next ``plan`` reads the store (else it decides from memory: no I/O, so
        the engine may call it on its loop instead of handing it to a thread)."""
        return self._stale(self._clock(), self.store.change_token())

    def _stale(self, now: float, token: int) -> bool:
        view = self._view
        return (
            view is None
            or self._dirty
            or token != self._token
            or view.day != self._midnight(now)
            or view.budgeted != (self._config().budget_usd_daily is not None)
        )

    def _refresh(self, now: float) -> QueueView:
        token = self.store.change_token()  # first: a change during the reads moves it again
        day = self._midnight(now)
        budget = self._config().budget_usd_daily is not None
        view = self._view
        if view is not None and not self._stale(now, token):
            return view
        self._dirty = False
        self._token = token
        self.reads += 1
        stamps: Mapping[str, tuple[Any, ...]] = {}
        if self._incremental:
            changes = self.store.tasks_changed_since(self._rev)
            if changes.incremental:
                self._apply_changes(changes)
            else:  # the store cannot tell what changed: compare the queue's stamps instead
                self._incremental = False
        if not self._incremental:
            stamps = self._refresh_by_stamps(view)
        self._generation += 1
        self._view = QueueView(
            paused=self.store.get_setting("fleet_paused") == "1",
            rate_limits={rl.account: (rl, b) for rl, b in self.store.rate_limits()},
            # today's spend only matters to a daily budget: no budget, no query
            spent_today=self.store.spent_since(day) if budget else 0.0,
            day=day,
            generation=self._generation,
            stamps=stamps,
            coders=frozenset(c for c, n in self._coders.items() if n > 0),
            budgeted=budget,
        )
        return self._view

    def _apply_changes(self, changes: TaskChanges) -> None:
        """Apply ``tasks_changed_since``: the tasks that changed, and the holds a change to them
        can make or release (their own dependencies, their dependents')."""
        self._rev = changes.marker
        if changes.full:
            self._reset([t for t in changes.tasks if t.status == TaskStatus.QUEUED])
            self._hold_all(self.store.unfinished_dependencies())
            return
        if not changes.tasks:
            return
        for t in changes.tasks:
            self._drop(t.id)
            if t.status == TaskStatus.QUEUED:
                self._put(t)
        for t in changes.tasks:
            if t.status != TaskStatus.QUEUED:
                self._written.pop(t.id, None)
        for tid, names in self.store.unfinished_dependencies([t.id for t in changes.tasks]).items():
            if names and tid in self._tasks:
                self._hold(tid, names)
            else:
                self._unhold(tid)

    def _refresh_by_stamps(self, view: QueueView | None) -> Mapping[str, tuple[Any, ...]]:
        """The queue read again for a store without change counters: one light query says which
        queued tasks changed since the last read; only those are fetched again."""
        stamps = self.store.queued_stamps()
        old = view.stamps if view is not None else {}
        moved = [tid for tid, st in stamps.items() if old.get(tid) != st]
        if len(moved) > REFETCH_ONE_BY_ONE:
            self._reset(self.store.list_tasks(TaskStatus.QUEUED))
        else:
            for tid in [tid for tid in self._tasks if tid not in stamps]:
                self._drop(tid)
                self._written.pop(tid, None)
            for tid in moved:
                self._drop(tid)
                t = self.store.get_task(tid)
                if t is not None and t.status == TaskStatus.QUEUED:
                    self._put(t)
        self._hold_all(self.store.unfinished_dependencies())
        return stamps

    # the holds: which queued tasks wait on unfinished dependencies, by the dependencies' names
    def _hold_all(self, unfinished: Mapping[str, list[str]]) -> None:
        self._held, self._held_on, self._awaited = {}, {}, Counter()
        for tid, names in unfinished.items():
            if names:
                self._hold(tid, names)

    def _hold(self, tid: str, names: Sequence[str]) -> None:
        self._unhold(tid)
        self._held[tid] = "after " + ", ".join(names)
        self._held_on[tid] = tuple(names)
        self._awaited.update(set(names))

    def _unhold(self, tid: str) -> None:
        self._held.pop(tid, None)
        for name in set(self._held_on.pop(tid, ())):
            self._awaited[name] -= 1
            if self._awaited[name] <= 0:
                del self._awaited[name]

    # the queue in claim order, kept sorted as tasks come and go (never sorted whole again)
    def _queue(self, claiming: frozenset[str]) -> Iterator[Task]:
        """The queue in claim order without the tasks being claimed (the caller holds the lock:
        it is read as it is iterated)."""
        if not claiming:
            return (t for _, t in self._order)
        return (t for _, t in self._order if t.id not in claiming)

    def _reset(self, tasks: Sequence[Task]) -> None:
        self._tasks = {t.id: t for t in tasks}
        self._order = sorted(((claim_order(t), t) for t in tasks), key=lambda e: e[0])
        self._coders = Counter(t.coder or t.spec.coder for t in tasks)
        self._written = {k: v for k, v in self._written.items() if k in self._tasks}

    def _put(self, t: Task) -> None:
        self._tasks[t.id] = t
        insort(self._order, (claim_order(t), t), key=lambda e: e[0])
        self._coders[t.coder or t.spec.coder] += 1

    def _drop(self, tid: str) -> None:
        old = self._tasks.pop(tid, None)
        if old is None:
            return
        key = claim_order(old)
        i = bisect_left(self._order, key, key=lambda e: e[0])
        if i < len(self._order) and self._order[i][1].id == tid:
            del self._order[i]
        else:  # pragma: no cover - the order and the map always agree
            self._order = [e for e in self._order if e[1].id != tid]
        self._coders[old.coder or old.spec.coder] -= 1
        self._unhold(tid)

    # -- deciding ------------------------------------------------------------------------------
    def plan(self, admitting: bool = False, running: int | None = None) -> Plan:
        """Every queued task with its decision, in claim order; starts nothing. ``admitting``:
        the caller starts the admitted tasks at once (their slots read as taken, not starting).
        ``running``: the slots taken, counted by the caller where they are kept (the planner's
        ``running`` callable when None: only on the thread that changes them)."""
        with self._lock:
            return self._plan(self._refresh(self._clock()), admitting, running)

    def plan_from_memory(self, admitting: bool = False) -> Plan | None:
        """``plan`` when it needs no store read and no other thread is planning (it never
        blocks: the engine calls it on its loop); None: hand ``plan`` to a thread instead."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            view = self._view
            if view is None or self._stale(self._clock(), self.store.change_token()):
                return None
            return self._plan(view, admitting)
        finally:
            self._lock.release()

    def refresh(self) -> None:
        """Read what changed in the store, deciding nothing (the engine, while its slots are
        full: when one frees, its next task is picked from memory)."""
        with self._lock:
            self._refresh(self._clock())

    def admit(self, free: int, running: int, *, wait: bool = False) -> Admission | None:
        """The engine's pick for ``free`` slots (``running``: the slots taken, counted on its
        loop): the first tasks in claim order that may start, computed in proportion to the
        head of the queue up to them, not to the queue's length. Without ``wait`` it never
        blocks and never reads the store (the engine calls it on its loop): None then means
        "hand it to a thread with ``wait``", which reads what changed first. The same object
        comes back while nothing it depends on moved."""
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            now = self._clock()
            view = self._view
            if wait:
                view = self._refresh(now)
            elif view is None or self._stale(now, self.store.change_token()):
                return None
            return self._admit(view, free, running, now)
        finally:
            self._lock.release()

    def _admit(self, view: QueueView, free: int, running: int, now: float) -> Admission:
        key, lazy = self._decide(view, running, now, note_starting=False)
        key += (free,)
        if key == self._admit_key and (self._admit_next_at is None or now < self._admit_next_at):
            return self._admitted
        out: Plan = []
        picked: list[Task] = []
        whole = True
        for t, d in lazy:
            out.append((t, d))
            if d.ok:
                picked.append(t)
                if len(picked) >= free:
                    whole = False  # the rest waits behind slots now full
                    break
        self._admit_next_at = _next_at(out, now)
        self._admit_key, self._admitted = key, Admission(tuple(picked), out, whole)
        return self._admitted

    def _decide(
        self, view: QueueView, running: int, now: float, note_starting: bool
    ) -> tuple[tuple[Any, ...], Iterator[tuple[Task, Decision]]]:
        """What the decisions on ``view`` depend on (a key: the same key, the same decisions
        until the clock passes a time-based gate), and the decisions, lazily, in claim order
        (the caller holds ``self._lock`` while it takes them)."""
        cfg = self._config()
        gcfg = gate_config(cfg)
        head = self._headroom()
        claiming = frozenset(self._claiming)
        key = (
            view.generation, claiming, running, gcfg, cfg.default_coder, self.headroom_key(head, running),
            note_starting,
        )  # fmt: skip
        lazy = decisions(
            self._queue(claiming), gcfg, self._inputs(view, running, head, now), self._mem,
            default_coder=cfg.default_coder, held=self._held, account_of=self._accounts(),
            note_starting=note_starting, ordered=True,
        )  # fmt: skip
        return key, lazy

    def _inputs(self, view: QueueView, running: int, head: Headroom, now: float) -> GateInputs:
        return GateInputs(
            paused=view.paused,
            running=running,
            headroom=head,
            now=now,
            rate_limits=view.rate_limits,
            host_tags=self._tags,
            spent_today=view.spent_today,
            own_load=float(running),  # this engine's agents: not load that holds them back
        )

    def _accounts(self) -> Callable[[Task, str], str]:
        """``account_of`` for one plan, each (coder, model) worked out once."""
        accounts: dict[tuple[str, str | None], str] = {}

        def account(t: Task, coder: str) -> str:
            key = (coder, t.model or t.spec.model)
            found = accounts.get(key)
            if found is None:
                found = accounts[key] = account_of(*key)
            return found

        return account

    def _plan(self, view: QueueView, admitting: bool, running: int | None = None) -> Plan:
        """The decisions on the whole queue (the caller holds ``self._lock``)."""
        now = self._clock()
        key, lazy = self._decide(view, self._running() if running is None else running, now, not admitting)
        if key == self._last_key and (self._next_at is None or now < self._next_at):
            return self._last
        out = list(lazy)
        self._next_at = _next_at(out, now)
        self._last_key, self._last = key, out
        return out

    def waiting_changes(self, decisions: Plan) -> dict[str, str | None]:
        """The waiting reasons to record: those that differ from what this planner recorded
        last (or, the first time, from the store's). Comparing with its own record, not the
        store's current value, keeps two engines from rewriting each other's reasons forever.

        A reason whose only change is a figure (a gate's reading: "memory: 22.9 GiB free" then
        "22.8") is recorded again at most every ``FIGURES_EVERY_S``: a queue of 10,000 tasks held
        by the memory gate was rewritten whole at every tenth of a GiB that moved, 8 % of a core
        while another program's memory came and went."""
        out: dict[str, str | None] = {}
        figures: dict[str, str | None] = {}
        for t, d in decisions:
            why = None if d.ok else d.reason
            was = self._written.get(t.id, t.waiting)
            if was == why:
                continue
            if why is not None and same_wait(why, was):
                figures[t.id] = why
            else:
                out[t.id] = why
        if figures and time.monotonic() - self._figures_at >= FIGURES_EVERY_S:
            out.update(figures)
        return out

    def recorded(self, reasons: Mapping[str, str | None]) -> None:
        """``reasons`` were written to the store."""
        self._written.update(reasons)
        if reasons:
            self._figures_at = time.monotonic()
