"""The engine on a thread of its own, behind the same ``EngineAPI`` (issue 14).

Hosted as a worker on the cockpit's event loop, every store query, event parse and snapshot build
of the engine (or of an attached view) would compete with key presses and repaints: a ten
thousand task snapshot rebuilt there is a frozen cockpit. ``EngineThread`` gives the engine an
asyncio loop on a thread of its own and keeps the cockpit's side to cheap hand-overs:

- ``snapshot()`` returns the engine's last snapshot: an immutable value it keeps ready (a
  reference read, no I/O);
- ``subscribe()`` carries the engine's bus batches over to the caller's loop, merged: whatever
  arrived since the cockpit last looked is one batch (bounded; a cockpit that falls behind loses
  the oldest items and gets a ``Notice`` saying how many, the engine never waits);
- each command runs on the engine's loop and its result comes back to the caller's;
- ``call(fn, ...)`` runs one of the engine-side functions that take the engine (follow-up,
  approve, take over) on the engine's loop too;
- ``follow_events(ids)`` says whose agent events the cockpit shows: the others are dropped on the
  engine's loop, not carried over (an attached view does not even read them);
- the stored reads (``events``, ``attempts``, ``transitions``) run on a worker thread of the
  caller's loop: they need only the store, not the engine's loop.

Both threads share one interpreter lock. A thread that wants it waits up to the switch interval
(5 ms by default) for a busy holder to let go, and the cockpit's loop takes it back after every
wait for input: under 32 loud agents those waits were 7-19 % of the time its late ticks lost
(3-10 % at 1 ms). The engine's thread therefore starts with the interval at 1 ms
(``SWITCH_INTERVAL``; bench/bench_cockpit.py measures both).

Both threads also share the process's CPU time, and under load the cockpit's thread waited for a
CPU while the engine's ran. On Linux a thread has a niceness of its own, and the threads it
starts inherit it: the engine's thread runs niced (``engine_nice``: the agents' niceness, at most
``ENGINE_NICE``), so the kernel gives the cockpit's thread the CPU first. Against the agents
nothing changes (the cockpit's session is one scheduling group, whatever its threads' niceness),
and what the engine starts runs at its own niceness or above that: agents, verifiers and setup
commands at ``agent_nice`` as before (``proctree.nice_at_least``), the rest (git, notifications)
at the engine's. Under 32 agents at 200 events/s, in turn with the engine at 0 (three pairs):
the time the cockpit's loop ran late fell by 36-45 % (13.8 s against 22.6 s in 120 s), the loop
lag's p99 from 45.0 to 34.6 ms and an ``esc`` close's p99 from 89.8 to 57.0 ms.

A fair share of the lock is still too little for a key: under 32 agents at 200 events/s the
engine's thread held it half the time, so drawing what a key changed took up to twice as long as
on an idle cockpit. A person's key comes first: for ``KEY_PRIORITY_S`` after each key, the
engine's thread stands aside (``KeyPriority``) before each callback of its loop, not only between
two turns of it: under that load one turn ran the callbacks of dozens of agents' output, up to
30 ms with the lock taken half the time, and a key's drawing still took twice its time
(``_KeyFirstReady``). Nothing is lost meanwhile: the agents' output waits in its files and pipes,
and a cockpit that waits on the engine ends the standing aside.

Any other attribute (``store``, ``home``, ``cfg``) is the engine's own. Nothing here imports
Textual. The cockpit starts the engine with ``run()`` (awaiting it as a worker, so the engine
stopping on its own is still news) and stops it with ``shutdown()``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import selectors
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from fleet_tui.scheduler.api import CommandResult
from fleet_tui.scheduler.model import (
    AgentEvent,
    Attempt,
    EngineEvent,
    Event,
    Notice,
    Snapshot,
    TaskSpec,
    Transition,
)

T = TypeVar("T")

#: items the cockpit may fall behind by before the oldest are dropped (the bus's own bound)
BACKLOG = 20_000
#: the interpreter's switch interval while an engine is hosted (seconds; Python's default is 5 ms;
#: ``fleet-tui run`` uses the same, scheduler/onloop.py, which the cockpit must not import)
SWITCH_INTERVAL = 0.001
#: how long the engine's loop stands aside after a key (seconds): an idle cockpit draws what a
#: key changes in 5-40 ms on this 2-core machine, a loud one in up to twice that
KEY_PRIORITY_S = 0.06
#: the most the engine's thread is niced by (above the cockpit's own niceness)
ENGINE_NICE = 5


def engine_nice(agent_nice: int) -> int:
    """How much the engine's thread is niced: the agents' niceness, at most ``ENGINE_NICE``. Not
    above it: what the engine starts inherits it, and an agent can be niced more, never less (a
    fleet run with ``agent_nice = 0`` keeps an engine at 0 and its agents with it)."""
    return max(0, min(agent_nice, ENGINE_NICE))


def nice_this_thread(step: int) -> None:
    """Raise the calling thread's niceness by ``step`` (Linux: a thread's own, inherited by the
    threads and processes it starts). Elsewhere niceness is the whole process's, the cockpit's
    too: left alone there."""
    if step <= 0 or not sys.platform.startswith("linux"):
        return
    me = threading.get_native_id()
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + step))


class KeyPriority:
    """A key in hand on the cockpit's thread, which the hosted engine's loop stands aside for.

    ``key()`` (as a key arrives: on the terminal driver's input thread, and again as the cockpit's
    loop takes it) gives the key a window of ``cap`` seconds
    from now: a key pressed inside another's window moves its end (a help closed 40 ms after it
    opened, under 32 loud agents, used to find the engine back, and running its own ``cap / 2``,
    for most of its close). ``release()`` closes the window early: the cockpit calls it whenever
    it waits on the engine's loop, which must not wait for the cockpit in turn. The engine's
    thread calls ``stand_aside()`` before each callback of its loop: inside a window it waits, with
    the interpreter lock free, until the window ends, at most ``2 * cap`` at a time. After each
    wait the engine runs at least ``cap / 2`` before it stands aside again, so a key held down
    (auto-repeat) slows the engine, never stops it."""

    def __init__(self, cap: float = KEY_PRIORITY_S) -> None:
        self.cap = cap
        self._free = threading.Event()
        self._free.set()
        self._until = 0.0
        self._runs_until = 0.0  # the engine's own time after a wait (monotonic)
        self.waits = 0  # times the engine's loop stood aside (for tests and benches)

    def key(self) -> None:
        self._until = time.monotonic() + self.cap
        self._free.clear()

    def release(self) -> None:
        self._free.set()

    def stand_aside(self) -> None:
        if self._free.is_set():
            return
        now = time.monotonic()
        if now < self._runs_until:
            return
        if now >= self._until:
            self._free.set()
            return
        self.waits += 1
        longest = now + 2 * self.cap
        while (left := min(self._until, longest) - time.monotonic()) > 0:
            if self._free.wait(left):  # released
                break
        self._runs_until = time.monotonic() + self.cap / 2


class _KeyFirstSelector(selectors.DefaultSelector):
    """The engine loop's selector: each turn of an asyncio loop starts with ``select``; this one
    stands aside for a key in hand once the wait for I/O is over, before the turn's callbacks.
    Where ``_KeyFirstReady`` is in place the turn's first callback stands aside anyway; this is
    what is left where asyncio's ready queue is not the deque it replaces."""

    def __init__(self, priority: KeyPriority) -> None:
        super().__init__()
        self._priority = priority

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(timeout)
        self._priority.stand_aside()
        return ready


class _KeyFirstReady(deque[Any]):
    """The engine loop's queue of ready callbacks (asyncio's ``_ready``, which its loop takes
    each callback from with ``popleft``): stands aside for a key in hand before each one. A
    plain ``deque`` otherwise; when no key is in hand the check is one ``Event.is_set``."""

    def __init__(self, priority: KeyPriority) -> None:
        super().__init__()
        self._stand_aside = priority.stand_aside

    def popleft(self) -> Any:
        self._stand_aside()
        return super().popleft()


class EngineThread:
    """``EngineThread(engine, run=engine.run)``: ``engine`` (an Engine or an AttachedView) with its
    loop on a thread named ``fleet-engine``, niced by ``nice`` (``engine_nice``);
    ``switch_interval`` is set for the process when the thread starts (None: left as it is).
    ``reads``: where the cockpit's stored reads go (a ``Controller`` on a connection of their
    own, ``launcher.stored_reads``), else to ``engine``."""

    def __init__(
        self,
        engine: Any,
        run: Callable[[], Awaitable[None]] | None = None,
        *,
        switch_interval: float | None = SWITCH_INTERVAL,
        reads: Any | None = None,
        nice: int = 0,
    ) -> None:
        self.inner = engine
        self.nice = nice
        self.reads = reads if reads is not None else engine
        self.switch_interval = switch_interval
        self._run = run if run is not None else engine.run
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._main: concurrent.futures.Future[None] | None = None
        self._wanted: frozenset[str] | None = None  # agent events of these tasks only; None: all
        #: the cockpit's key in hand, which the engine's loop stands aside for
        self.priority = KeyPriority()

    # ------------------------------------------------------------------ the engine's loop

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                ready = threading.Event()
                loop = asyncio.SelectorEventLoop(_KeyFirstSelector(self.priority))
                # python's asyncio takes ready callbacks from ``_ready``, a deque (3.11-3.13);
                # tests/app/test_hosted.py checks it still does
                if type(getattr(loop, "_ready", None)) is deque:
                    loop._ready = _KeyFirstReady(self.priority)  # type: ignore[attr-defined]

                def main() -> None:
                    nice_this_thread(self.nice)  # before its worker threads: they inherit it
                    asyncio.set_event_loop(loop)
                    ready.set()
                    try:
                        loop.run_forever()
                    finally:  # what asyncio.run does on the way out
                        left = asyncio.all_tasks(loop)
                        for task in left:
                            task.cancel()
                        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
                        loop.run_until_complete(loop.shutdown_asyncgens())
                        loop.close()

                if self.switch_interval is not None:
                    sys.setswitchinterval(self.switch_interval)
                self._thread = threading.Thread(target=main, name="fleet-engine", daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    def _submit(self, make: Callable[[], Awaitable[T]]) -> concurrent.futures.Future[T]:
        async def go() -> T:
            return await make()

        self.priority.release()  # the cockpit waits on the engine's loop: no standing aside for it
        return asyncio.run_coroutine_threadsafe(go(), self._ensure())

    async def _there(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run ``make()`` on the engine's loop; the caller's loop waits without blocking."""
        return await asyncio.wrap_future(self._submit(make))

    async def run(self) -> None:
        """Run the engine on its thread until it stops; its error, if any, is raised here."""
        if self._main is None:
            self._main = self._submit(self._run)
        try:
            await asyncio.wrap_future(self._main)
        except asyncio.CancelledError:
            # the cockpit is going away without a shutdown: stop the engine the way cancelling
            # its worker used to (agents are left running for a later adopter)
            main = self._main
            if self._loop is not None and not main.done():
                self._loop.call_soon_threadsafe(main.cancel)
            raise

    def stop(self, timeout: float = 10.0) -> None:
        """End the engine's loop (after ``shutdown``) and wait for its thread (blocking)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if self._main is not None and not self._main.done():
            self._main.cancel()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)

    # ------------------------------------------------------------------ EngineAPI

    def snapshot(self) -> Snapshot:
        snap: Snapshot = self.inner.snapshot()
        return snap

    async def subscribe(self) -> AsyncIterator[list[EngineEvent]]:
        here = asyncio.get_running_loop()
        pending: deque[EngineEvent] = deque()
        wake = asyncio.Event()
        state = {"dropped": 0, "closed": False}

        def deliver(batch: Sequence[EngineEvent]) -> None:  # on the caller's loop
            pending.extend(batch)
            over = len(pending) - BACKLOG
            for _ in range(max(over, 0)):
                pending.popleft()
            if over > 0:
                state["dropped"] += over
            wake.set()

        def closed() -> None:
            state["closed"] = True
            wake.set()

        async def pump() -> None:  # on the engine's loop
            try:
                async for batch in self.inner.subscribe():
                    wanted = self._wanted
                    if wanted is not None:
                        batch = [
                            e for e in batch if not isinstance(e, AgentEvent) or e.event.task_id in wanted
                        ]
                        if not batch:
                            continue
                    here.call_soon_threadsafe(deliver, batch)
            finally:
                if not here.is_closed():
                    here.call_soon_threadsafe(closed)

        feeding = self._submit(pump)
        try:
            while True:
                await wake.wait()
                wake.clear()
                batch = list(pending)
                pending.clear()
                if state["dropped"]:
                    batch.insert(
                        0,
                        Notice(
                            f"display fell behind: {state['dropped']} events skipped "
                            "(all are on disk: fleet-tui logs)"
                        ),
                    )
                    state["dropped"] = 0
                if batch:
                    yield batch
                if state["closed"]:
                    if feeding.done() and not feeding.cancelled() and feeding.exception() is not None:
                        raise feeding.exception()  # type: ignore[misc]
                    return
        finally:
            feeding.cancel()

    def follow_events(self, task_ids: frozenset[str] | None) -> None:
        """Hand over the agent events of ``task_ids`` only (None: every task's). Other events are
        unchanged. Called from the cockpit's thread: one reference, swapped whole."""
        self._wanted = task_ids
        inner = getattr(self.inner, "follow_events", None)
        if inner is not None:
            inner(task_ids)

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``fn(engine, *args)`` on the engine's loop (the functions ``fleet-tui send``, ``approve``
        and ``takeover`` share with the cockpit)."""
        return await self._there(lambda: fn(self.inner, *args))

    async def add(self, specs: Sequence[TaskSpec]) -> CommandResult:
        return await self._there(lambda: self.inner.add(specs))

    async def kill(self, ref: str) -> CommandResult:
        return await self._there(lambda: self.inner.kill(ref))

    async def pause(self, ref: str | None) -> CommandResult:
        return await self._there(lambda: self.inner.pause(ref))

    async def resume(self, ref: str | None) -> CommandResult:
        return await self._there(lambda: self.inner.resume(ref))

    async def retry(self, ref: str) -> CommandResult:
        return await self._there(lambda: self.inner.retry(ref))

    async def cancel(self, ref: str) -> CommandResult:
        return await self._there(lambda: self.inner.cancel(ref))

    async def merge(self, ref: str) -> CommandResult:
        return await self._there(lambda: self.inner.merge(ref))

    async def answer(self, question_id: str, text: str) -> CommandResult:
        return await self._there(lambda: self.inner.answer(question_id, text))

    async def set_config(self, key: str, value: str) -> CommandResult:
        return await self._there(lambda: self.inner.set_config(key, value))

    # the stored reads go from the caller's loop straight to a worker thread of its own: through
    # the engine's loop, each waited for that loop to take the answer back (10-60 ms under 32
    # loud agents, most of a stream fill's time). With ``reads`` they also skip the engine's
    # store connection, whose lock its event writes hold under load (a fill's read took up to
    # 280 ms waiting for it)
    async def events(self, ref: str, attempt: int | None = None, limit: int = 2000) -> list[Event]:
        return await asyncio.to_thread(self.reads.stored_events, ref, attempt, limit)

    async def attempts(self, ref: str) -> list[Attempt]:
        return await asyncio.to_thread(self.reads.stored_attempts, ref)

    async def transitions(self, ref: str) -> list[Transition]:
        return await asyncio.to_thread(self.reads.stored_transitions, ref)

    async def diff(self, ref: str) -> str:
        return await self._there(lambda: self.inner.diff(ref))

    async def pull_request(self, ref: str) -> str | None:
        return await self._there(lambda: self.inner.pull_request(ref))

    async def shutdown(self, leave_running: bool) -> None:
        await self._there(lambda: self.inner.shutdown(leave_running))
        if self._main is not None:  # the engine's run() returns once it has stopped
            await asyncio.wait([asyncio.wrap_future(self._main)], timeout=30)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def on_engine(engine: Any, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``fn(engine, *args)``, on the engine's own loop when it has one (``EngineThread``)."""
    if isinstance(engine, EngineThread):
        return await engine.call(fn, *args)
    return await fn(engine, *args)
