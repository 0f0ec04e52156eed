"""The cockpit never waits on the engine: with a real engine on a real store, no store call is made
on the cockpit's own thread, and no engine code runs there (issue 14). Asserted by recording the
thread of every store call and profiling the cockpit's thread, not by timing anything."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from textual import events
from textual.pilot import Pilot

from fleet_tui.app.app import FleetApp
from fleet_tui.app.hosted import EngineThread, KeyPriority
from fleet_tui.config import Config
from fleet_tui.launcher import stored_reads
from fleet_tui.scheduler.api import CommandResult
from fleet_tui.scheduler.bus import Bus
from fleet_tui.scheduler.engine import Engine
from fleet_tui.scheduler.model import AgentEvent, EngineEvent, Event, Notice, TaskSpec
from fleet_tui.scheduler.states import TERMINAL, TaskStatus
from fleet_tui.scheduler.store.sqlite_store import SqliteStore
from fleet_tui.scheduler.view import AttachedView
from fleet_tui.screens.detail import DetailScreen

from . import scenarios as sc

pytestmark = pytest.mark.timeout(120)

#: no machine gate: the test must not depend on how busy the machine is
CFG = Config(
    default_coder="sim", max_concurrent=2, max_load_per_core=1000.0, mem_floor_gib=0.0, disk_floor_gib=0.0
)


class RecordingStore:
    """A store that notes which thread each of its calls ran on."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self.calls: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kw: Any) -> Any:
            with self._lock:
                self.calls.append((name, threading.get_ident()))
            return attr(*args, **kw)

        return call

    def on(self, ident: int) -> list[str]:
        with self._lock:
            return [name for name, t in self.calls if t == ident]


async def wait_for(pilot: Any, condition: Callable[[], object], what: str, timeout: float = 30) -> None:
    """Let the app run until ``condition()`` holds: the engine works on its own thread, so the
    cockpit's loop may well be idle meanwhile (bounded, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} (on screen: {pilot.app.screen!r})")
        await pilot.pause(0.02)


def _store(home: Path, n: int) -> tuple[SqliteStore, RecordingStore]:
    store = SqliteStore(str(home / "fleet.db"))
    store.add_tasks(
        [
            TaskSpec(name=f"task-{i:02d}", prompt="@sim steps=3 pace=0.05", cwd=str(home), coder="sim")
            for i in range(n)
        ],
        1.0,
    )
    return store, RecordingStore(store)


async def _exercise(app: FleetApp, pilot: Any, engine: Any, done: Callable[[], bool]) -> None:
    await wait_for(pilot, lambda: app.queue.row_count > 0, "the queue")
    await wait_for(pilot, done, "the engine's work", timeout=60)
    for key in ("down", "up", "down"):
        await pilot.press(key)
    app.queue.select_id(min(app.tasks))
    await pilot.press("enter")  # the detail screen loads events, attempts, transitions, a diff
    await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen) and app.screen.loaded, "detail")
    await pilot.press("escape")
    await pilot.press("P")  # pause the fleet, then resume it: commands through the store
    await wait_for(pilot, lambda: app.snap.gauges.paused, "paused", timeout=30)
    await pilot.press("P")
    await wait_for(pilot, lambda: not app.snap.gauges.paused, "resumed", timeout=30)


async def test_a_hosted_engine_never_touches_the_store_on_the_cockpits_thread(tmp_path: Path) -> None:
    raw, store = _store(tmp_path, 3)
    engine = Engine(
        store,
        tmp_path,
        Config(
            default_coder="sim",
            max_concurrent=2,
            max_load_per_core=1000.0,
            mem_floor_gib=0.0,
            disk_floor_gib=0.0,
        ),
    )
    store.calls.clear()  # (setting up before the cockpit starts is no wait)
    hosted = EngineThread(engine, engine.run)
    app = FleetApp(hosted, on_quit="leave", run_engine=hosted.run)
    me = threading.get_ident()
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await _exercise(
                app,
                pilot,
                hosted,
                lambda: sum(t.status == TaskStatus.DONE for t in app.tasks.values()) >= 1,
            )
            assert store.calls, "the engine used the store"
            assert store.on(me) == []
            await hosted.shutdown(leave_running=False)
    finally:
        hosted.stop()
        raw.close()
    assert store.on(me) == []
    assert hosted.thread is not None and hosted.thread.ident != me


async def test_an_attached_view_never_touches_the_store_on_the_cockpits_thread(tmp_path: Path) -> None:
    raw, store = _store(tmp_path, 2)
    view = AttachedView(store, tmp_path, CFG)
    store.calls.clear()
    hosted = EngineThread(view, view.run)
    app = FleetApp(hosted, on_quit="leave", run_engine=hosted.run)
    me = threading.get_ident()
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await _exercise(app, pilot, hosted, lambda: len(app.tasks) == 2)
            assert store.calls and store.on(me) == []
    finally:
        hosted.stop()
        raw.close()
    assert store.on(me) == []


class ThreadFake:
    """An engine that records the thread its commands run on."""

    def __init__(self, crash: bool = False) -> None:
        self.bus = Bus()
        self.threads: list[int] = []
        self.crash = crash

    async def run(self) -> None:
        if self.crash:
            raise RuntimeError("store is locked")
        await asyncio.Event().wait()

    async def subscribe(self) -> AsyncIterator[list[EngineEvent]]:
        async for batch in self.bus.subscribe():
            yield batch

    async def kill(self, ref: str) -> CommandResult:
        self.threads.append(threading.get_ident())
        return CommandResult(True, f"killed {ref}")


async def test_stored_reads_do_not_wait_for_the_engines_loop(tmp_path: Path) -> None:
    """A stream fill or a detail screen reads the store from a worker thread of the cockpit's own:
    with the engine's loop stuck in a long piece of work, they still answer (through that loop,
    each waited for it to take the answer back: 30-60 ms under a loud fleet)."""
    raw, store = _store(tmp_path, 1)
    task = raw.list_tasks()[0]
    raw.append_events([Event(task.id, 1, i, 1.0, "text", text=f"line {i}") for i in range(1, 4)])
    view = AttachedView(store, tmp_path, CFG)
    hosted = EngineThread(view, view.run)
    busy, release = threading.Event(), threading.Event()

    async def hold(engine: AttachedView) -> None:  # blocks the engine's loop itself
        busy.set()
        release.wait(60)

    held = asyncio.ensure_future(hosted.call(hold))
    try:
        await asyncio.to_thread(busy.wait, 30)
        events = await asyncio.wait_for(hosted.events(task.name, None, 200), 30)
        assert [e.text for e in events] == ["line 1", "line 2", "line 3"]
        assert await asyncio.wait_for(hosted.transitions(task.id), 30) == raw.transitions(task.id)
        assert await asyncio.wait_for(hosted.attempts(task.id), 30) == []
        assert not held.done(), "the engine's loop was free after all"
        assert await asyncio.wait_for(hosted.events("no-such-task"), 30) == []
    finally:
        release.set()
        await held
        hosted.stop()
        raw.close()


async def test_stored_reads_do_not_wait_for_a_write_on_the_engines_connection(tmp_path: Path) -> None:
    """The engine's store connection is behind one lock, which its event writes hold while loud
    agents stream (a stream fill waited up to 280 ms for it). The cockpit's stored reads go to a
    read-only connection of their own (``launcher.stored_reads``): with a write transaction open
    on the engine's connection, they still answer, with what was committed."""
    raw, _ = _store(tmp_path, 1)
    task = raw.list_tasks()[0]
    raw.append_events([Event(task.id, 1, i, 1.0, "text", text=f"line {i}") for i in range(1, 4)])
    engine = Engine(raw, tmp_path, CFG)
    reads = stored_reads(raw)
    assert reads is not None and reads.store is not raw
    hosted = EngineThread(engine, engine.run, reads=reads)
    writing, done = threading.Event(), threading.Event()

    def long_write() -> None:  # an event batch of the engine's, still being written
        with raw._tx() as db:
            db.execute("UPDATE tasks SET waiting = 'mid-write' WHERE id = ?", (task.id,))
            writing.set()
            done.wait(60)

    writer = threading.Thread(target=long_write)
    writer.start()
    try:
        await asyncio.to_thread(writing.wait, 30)
        events = await asyncio.wait_for(hosted.events(task.name, None, 200), 30)
        assert [e.text for e in events] == ["line 1", "line 2", "line 3"]
        assert await asyncio.wait_for(hosted.transitions(task.id), 30) == reads.store.transitions(task.id)
        assert await asyncio.wait_for(hosted.attempts(task.id), 30) == []
        assert writer.is_alive(), "the write ended before the reads: they proved nothing"
    finally:
        done.set()
        writer.join(30)
        hosted.stop()
        reads.store.close()
        raw.close()


def test_stored_reads_have_a_connection_of_their_own_only_for_sqlite() -> None:
    """A PostgreSQL store hands its threads pooled connections already: nothing to open."""
    assert stored_reads(object()) is None


async def test_commands_run_on_the_engines_thread_and_batches_come_back_merged() -> None:
    fake = ThreadFake()
    hosted = EngineThread(fake, fake.run)
    runner = asyncio.create_task(hosted.run())
    try:
        assert (await hosted.kill("t-1")).message == "killed t-1"
        assert fake.threads and fake.threads[0] != threading.get_ident()
        assert hosted.thread is not None and fake.threads[0] == hosted.thread.ident
        stream = hosted.subscribe().__aiter__()
        first = asyncio.ensure_future(stream.__anext__())
        deadline = time.monotonic() + 30
        while fake.bus.subscribers == 0:  # the pump subscribes on the engine's loop
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)

        async def publish(engine: ThreadFake) -> None:  # two engine-side batches, on its loop
            engine.bus.publish([Notice("a")])
            engine.bus.publish([Notice("b")])

        await hosted.call(publish)
        got = await asyncio.wait_for(first, 30)
        while len(got) < 2:  # whatever arrived since the last look is one batch
            got += await asyncio.wait_for(stream.__anext__(), 30)
        assert got == [Notice("a"), Notice("b")]
        await stream.aclose()  # type: ignore[attr-defined]
    finally:
        runner.cancel()
        hosted.stop()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own niceness is Linux's")
async def test_the_engines_thread_and_what_it_starts_run_niced_below_the_cockpit() -> None:
    """The kernel gives the cockpit's thread the CPU before the engine's: the engine's thread is
    niced, and its worker threads and the processes they start inherit it; the cockpit's thread
    keeps its own."""
    import os
    import subprocess

    import anyio

    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    async def seen(engine: ThreadFake) -> tuple[int, int, int]:
        def in_a_worker() -> tuple[int, int]:
            child = subprocess.run(
                ["awk", "{print $19}", "/proc/self/stat"], capture_output=True, text=True, check=True
            )
            return niceness(), int(child.stdout)

        worker, child = await anyio.to_thread.run_sync(in_a_worker)
        return niceness(), worker, child

    mine = niceness()
    want = min(19, mine + 3)
    fake = ThreadFake()
    hosted = EngineThread(fake, fake.run, nice=3)
    runner = asyncio.create_task(hosted.run())
    try:
        assert await hosted.call(seen) == (want, want, want)
        assert niceness() == mine
    finally:
        runner.cancel()
        hosted.stop()


def test_the_engines_thread_is_niced_as_the_agents_at_most_five() -> None:
    from fleet_tui.app.hosted import engine_nice

    assert [engine_nice(n) for n in (0, 3, 5, 19, -2)] == [0, 3, 5, 5, 0]


async def test_an_engine_that_fails_on_its_thread_fails_its_run() -> None:
    fake = ThreadFake(crash=True)
    hosted = EngineThread(fake, fake.run)
    try:
        with pytest.raises(RuntimeError, match="store is locked"):
            await hosted.run()
    finally:
        hosted.stop()


class EngineWorkWatch:
    """A profile hook for the cockpit's thread: notes every engine-side function that runs there
    (the engine's packages, not the values that cross the boundary), every SQLite call and every
    ``time.sleep``. Instrumentation, not timing: what ran on the loop, not how long it took."""

    ROOT = Path(__file__).resolve().parents[2] / "src" / "fleet_tui"
    ENGINE_SIDE = ("scheduler", "coders", "notify", "sandbox", "github")
    #: what the cockpit may run of the engine's code: the values crossing the boundary (model,
    #: states, api), their display helpers, and the engine's snapshot (a reference read)
    ALLOWED_FILES = ("scheduler/model.py", "scheduler/states.py", "scheduler/api.py", "scheduler/series.py")
    ALLOWED_FUNCTIONS = {
        ("scheduler/engine.py", "snapshot"),
        ("scheduler/humans/inbox.py", "sanitize_for_display"),
    }

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.calls = 0
        self._verdict: dict[object, str | None] = {}

    def _engine_side(self, code: Any) -> str | None:
        verdict = self._verdict.get(code, "?")
        if verdict == "?":
            verdict = None
            try:
                rel = Path(code.co_filename).resolve().relative_to(self.ROOT).as_posix()
            except ValueError:
                rel = ""
            if (
                rel.startswith(self.ENGINE_SIDE)
                and rel not in self.ALLOWED_FILES
                and (rel, code.co_name) not in self.ALLOWED_FUNCTIONS
            ):
                verdict = f"{rel}:{code.co_qualname}"
            self._verdict[code] = verdict
        return verdict

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        self.calls += 1
        if event == "call":
            if (where := self._engine_side(frame.f_code)) is not None:
                self.seen.add(where)
        elif event == "c_call":
            owner = getattr(arg, "__self__", None)
            if isinstance(owner, sqlite3.Connection | sqlite3.Cursor):
                self.seen.add(f"sqlite3 {arg.__name__}")
            elif arg is time.sleep:
                self.seen.add("time.sleep")


async def test_the_cockpits_loop_never_runs_engine_work(tmp_path: Path) -> None:
    """Issue 14: while agents stream and keys act on them, nothing of the engine's work (store,
    parsing, planning, notifications) runs on the cockpit's thread, only hand-overs."""
    raw = SqliteStore(str(tmp_path / "fleet.db"))
    prompt = "@sim burst=200 seconds=2\n"
    raw.add_tasks(
        [TaskSpec(name=f"loud-{i}", prompt=prompt, cwd=str(tmp_path), coder="sim") for i in range(2)], 1.0
    )
    engine = Engine(raw, tmp_path, CFG)
    hosted = EngineThread(engine, engine.run)
    app = FleetApp(hosted, on_quit="leave", run_engine=hosted.run)
    watch = EngineWorkWatch()
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.queue.row_count == 2, "the queue")
            sys.setprofile(watch)  # this thread only: the cockpit's loop
            try:
                await wait_for(pilot, lambda: app.stream.flushes > 0, "live events on the stream")
                for key in ("down", "up"):
                    await pilot.press(key)
                app.queue.select_id(min(app.tasks))
                await pilot.press("enter")
                await wait_for(
                    pilot, lambda: isinstance(app.screen, DetailScreen) and app.screen.loaded, "detail"
                )
                await pilot.press("escape")
                await pilot.press("P")
                await wait_for(pilot, lambda: app.snap.gauges.paused, "paused", timeout=30)
                await pilot.press("P")
                await wait_for(pilot, lambda: not app.snap.gauges.paused, "resumed", timeout=30)
                await wait_for(
                    pilot, lambda: all(t.status in TERMINAL for t in app.tasks.values()), "both done", 60
                )
            finally:
                sys.setprofile(None)
            await hosted.shutdown(leave_running=False)
    finally:
        hosted.stop()
        raw.close()
    assert watch.calls > 1000, "the hook saw the cockpit at work"
    assert sorted(watch.seen) == []


def _ev(task_id: str, seq: int) -> Event:
    return Event(task_id=task_id, attempt=1, seq=seq, ts=1.0, kind="text", text=f"{task_id} {seq}")


async def test_the_hand_over_carries_only_the_followed_tasks_agent_events() -> None:
    fake = ThreadFake()
    hosted = EngineThread(fake, fake.run)
    runner = asyncio.create_task(hosted.run())
    stream = hosted.subscribe().__aiter__()
    try:
        first = asyncio.ensure_future(stream.__anext__())
        deadline = time.monotonic() + 30
        while fake.bus.subscribers == 0:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        hosted.follow_events(frozenset({"t-1"}))

        async def publish(engine: ThreadFake) -> None:
            engine.bus.publish([AgentEvent(_ev("t-2", 0))])  # nothing for the cockpit: no batch
            engine.bus.publish([AgentEvent(_ev("t-1", 0)), AgentEvent(_ev("t-2", 1)), Notice("n")])

        await hosted.call(publish)
        assert await asyncio.wait_for(first, 30) == [AgentEvent(_ev("t-1", 0)), Notice("n")]
        hosted.follow_events(None)  # every task's again
        await hosted.call(publish)
        got: list[EngineEvent] = []
        while len(got) < 4:
            got += await asyncio.wait_for(stream.__anext__(), 30)
        assert [e.event.task_id for e in got if isinstance(e, AgentEvent)] == ["t-2", "t-1", "t-2"]
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
        runner.cancel()
        hosted.stop()


async def test_an_attached_view_reads_only_the_followed_tasks_events_and_never_leaves_a_gap(
    tmp_path: Path,
) -> None:
    store = SqliteStore(str(tmp_path / "fleet.db"))
    try:
        store.add_tasks([TaskSpec(name=n, prompt="x", cwd=str(tmp_path), coder="shell") for n in "ab"], 1.0)
        a, b = (store.claim("e1", "h", (), 1.0, 60.0, "shell", None) for _ in "ab")
        assert a is not None and b is not None
        view = AttachedView(store, tmp_path, CFG)
        published: list[EngineEvent] = []
        view.bus.publish = published.extend  # type: ignore[method-assign,assignment]
        view.follow_events(frozenset({a.id}))
        await view.refresh()
        await view.poll_events()  # first sight: each task's position
        store.append_events([_ev(a.id, 0)])
        store.append_events([_ev(b.id, 0)])
        published.clear()
        await view.poll_events()
        assert published == [AgentEvent(_ev(a.id, 0))]  # b's was not even read
        store.append_events([_ev(b.id, 1)])  # after the last look, before b is followed
        view.follow_events(frozenset({a.id, b.id}))
        published.clear()
        await view.poll_events()
        assert published == [AgentEvent(_ev(b.id, 1))]
        view.follow_events(None)
        store.append_events([_ev(a.id, 1), _ev(b.id, 2)])
        published.clear()
        await view.poll_events()
        assert published == [AgentEvent(_ev(a.id, 1)), AgentEvent(_ev(b.id, 2))]
    finally:
        store.close()


async def test_the_cockpit_follows_the_events_of_the_stream_and_detail_screens_tasks() -> None:
    engine = sc.several_running()
    followed: list[frozenset[str] | None] = []
    engine.follow_events = followed.append  # type: ignore[attr-defined]
    app = sc.make_app(engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.stream.task_id is not None, "the stream")
        first = app.stream.task_id
        assert followed[-1] == {first}
        await pilot.press("down")
        await wait_for(pilot, lambda: app.stream.task_id != first, "the next task")
        second = app.stream.task_id
        assert second is not None and followed[-1] == {second}
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen), "detail")
        assert followed[-1] == {second}
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, DetailScreen), "back")
        await pilot.pause()
        assert followed[-1] == {second}


async def test_the_engines_loop_stands_aside_after_a_key_until_released() -> None:
    """A person's key comes first: once the cockpit has a key in hand, the engine's loop makes no
    turn (its thread waits with the interpreter lock free) until the window ends; the cockpit
    waiting on the engine ends it at once."""
    fake = ThreadFake()
    hosted = EngineThread(fake, fake.run)
    hosted.priority.cap = 60.0  # a window only release() ends, however slow the machine
    runner = asyncio.create_task(hosted.run())
    turns = [0]
    stop = threading.Event()

    async def spin(engine: ThreadFake) -> None:  # a busy engine: one turn of its loop after another
        while not stop.is_set():
            turns[0] += 1
            await asyncio.sleep(0)

    spinning = asyncio.ensure_future(hosted.call(spin))
    try:
        deadline = time.monotonic() + 30
        while turns[0] == 0:
            assert time.monotonic() < deadline, "the engine's loop never turned"
            await asyncio.sleep(0.01)
        hosted.priority.key()
        while hosted.priority.waits == 0:
            assert time.monotonic() < deadline, "the engine's loop never stood aside"
            await asyncio.sleep(0.01)
        held = turns[0]
        for _ in range(5):  # the cockpit's loop goes on meanwhile
            await asyncio.sleep(0.01)
        assert turns[0] == held  # the engine's thread waits in stand_aside, before its callbacks
        assert (await hosted.kill("t-1")).ok  # waiting on the engine releases it
        while turns[0] == held:
            assert time.monotonic() < deadline, "the engine's loop did not go on"
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        await spinning
        runner.cancel()
        hosted.stop()


async def test_the_engines_loop_stands_aside_between_the_callbacks_of_one_turn() -> None:
    """Under a loud fleet one turn of the engine's loop runs the callbacks of dozens of agents'
    output: a key that arrives during the turn holds back the callbacks still to run in it."""
    fake = ThreadFake()
    hosted = EngineThread(fake, fake.run)
    hosted.priority.cap = 60.0  # a window only release() ends, however slow the machine
    runner = asyncio.create_task(hosted.run())
    ran: list[int] = []

    async def one_turn(engine: ThreadFake) -> None:  # five callbacks, ready in the same turn
        loop = asyncio.get_running_loop()
        assert type(loop._ready).__name__ == "_KeyFirstReady"  # type: ignore[attr-defined]

        def first() -> None:
            hosted.priority.key()  # the cockpit gets a key while the turn runs
            ran.append(1)

        loop.call_soon(first)
        for n in range(2, 6):
            loop.call_soon(ran.append, n)

    turn = asyncio.ensure_future(hosted.call(one_turn))
    try:
        deadline = time.monotonic() + 30
        while hosted.priority.waits == 0:
            assert time.monotonic() < deadline, "the engine's loop never stood aside"
            await asyncio.sleep(0.01)
        for _ in range(5):  # the cockpit's loop goes on meanwhile
            await asyncio.sleep(0.01)
        assert ran == [1]  # the turn's other callbacks wait for the key
        hosted.priority.release()
        while ran != [1, 2, 3, 4, 5]:
            assert time.monotonic() < deadline, "the turn did not go on"
            await asyncio.sleep(0.01)
    finally:
        hosted.priority.release()
        await turn
        runner.cancel()
        hosted.stop()


def test_a_key_window_ends_by_itself_and_a_held_key_never_stops_the_engine() -> None:
    p = KeyPriority(cap=0.5)
    p.stand_aside()
    assert p.waits == 0  # no key in hand: no wait
    p.key()
    p.stand_aside()  # waits until the window has passed (nothing releases it)
    assert p.waits == 1
    p.key()  # auto-repeat: the next key at once
    p.stand_aside()
    assert p.waits == 1  # after a wait the engine runs for cap / 2 before it stands aside again
    p.release()
    p.stand_aside()
    assert p.waits == 1


def test_a_key_inside_another_keys_window_gets_a_whole_window_of_its_own() -> None:
    """A help closed 40 ms after it opened used to find the engine back for most of the close:
    the second key kept the first one's end."""
    p = KeyPriority(cap=60.0)
    p.key()
    later = time.monotonic()
    p.key()
    assert p._until >= later + 60.0


def test_keys_held_down_hold_the_engine_back_at_most_twice_the_window_at_a_time() -> None:
    p = KeyPriority(cap=0.1)
    stop = threading.Event()

    def auto_repeat() -> None:  # a key every 10 ms, each moving the window's end
        while not stop.wait(0.01):
            p.key()

    p.key()
    presser = threading.Thread(target=auto_repeat)
    presser.start()
    try:
        started = time.monotonic()
        p.stand_aside()
        waited = time.monotonic() - started
        assert p.waits == 1 and waited < 5.0  # ends by itself (2 x cap), keys or not
    finally:
        stop.set()
        presser.join()


class CountingPriority(KeyPriority):
    def __init__(self) -> None:
        super().__init__()
        self.keys = 0

    def key(self) -> None:
        self.keys += 1
        super().key()


@contextlib.asynccontextmanager
async def counting_cockpit() -> AsyncIterator[tuple[FleetApp, Pilot[None], CountingPriority]]:
    """A cockpit on a hosted engine whose key windows are counted, its queue shown."""
    engine = sc.several_running()

    async def forever() -> None:
        await asyncio.Event().wait()

    hosted = EngineThread(engine, run=forever)
    priority = hosted.priority = CountingPriority()
    app = sc.make_app(hosted)  # type: ignore[arg-type]
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.queue.row_count > 0, "the queue")
            yield app, pilot, priority
    finally:
        hosted.stop()


async def test_each_key_the_cockpit_handles_opens_a_window_for_its_hosted_engine() -> None:
    async with counting_cockpit() as (_, pilot, priority):
        for key in ("down", "question_mark", "escape"):
            await pilot.press(key)
        # each key twice: as the driver hands it over, and as the cockpit's loop takes it
        # (the window then ends a whole window after the key is handled)
        assert priority.keys == 6


async def test_a_key_is_in_hand_as_soon_as_the_terminals_driver_hands_it_over() -> None:
    """The driver hands keys over from its input thread; the window opens then, before the
    cockpit's loop (busy drawing a frame, say) has taken the key."""
    async with counting_cockpit() as (app, pilot, priority):
        before = priority.keys
        assert app._driver is not None
        app._driver.send_message(events.Key("down", None))  # as the driver's input thread does
        assert priority.keys == before + 1  # at once: the loop has not taken the key yet
        await wait_for(pilot, lambda: app.queue.cursor_row == 1, "the key handled")
