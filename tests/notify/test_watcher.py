"""The notifier's decisions on the engine's events: which kinds go where, done per task, rate limits
and their end, the fleet drained, and one send per event across watchers sharing a store."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from fleet_tui.config import Config, ConfigError, load_config
from fleet_tui.notify.notice import Notice
from fleet_tui.notify.send import Worker, split_entry, terminal_sequence
from fleet_tui.notify.watcher import Watcher
from fleet_tui.scheduler.bus import Bus
from fleet_tui.scheduler.model import Gauges, GaugesChanged, RateLimit, Snapshot, Task, TaskChanged, TaskSpec
from fleet_tui.scheduler.states import TaskStatus
from fleet_tui.scheduler.store.sqlite_store import SqliteStore


class Recorder:
    def __init__(self, name: str, kinds: tuple[str, ...] | None = None) -> None:
        self.name = name
        self.kinds = kinds
        self.got: list[Notice] = []
        self.cond = threading.Condition()

    def send(self, n: Notice) -> None:
        with self.cond:
            self.got.append(n)
            self.cond.notify_all()

    def titles(self, count: int) -> list[str]:
        with self.cond:
            self.cond.wait_for(lambda: len(self.got) >= count, timeout=10)
            return [n.title for n in self.got]


@dataclass(eq=False)  # hashable, like the real Engine
class StubEngine:
    store: Any
    cfg: Config
    owner: str
    snap: Snapshot = field(default_factory=lambda: Snapshot(taken_at=0.0))
    bus: Bus = field(default_factory=Bus)
    runners: dict[str, Any] = field(default_factory=dict)

    def clock(self) -> float:
        return time.time()

    def snapshot(self) -> Snapshot:
        return self.snap

    def wake(self) -> None:
        pass


def task(name: str, status: TaskStatus, notify_done: bool = False, reason: str | None = None) -> Task:
    return Task(id=f"t-{name}", spec=TaskSpec(name=name, prompt="p", notify_done=notify_done), status=status,
                reason=reason, attempt=1, updated_at=time.time(), result_text="All green.")  # fmt: skip


CFG = Config(notify_events=("question", "needs_human", "rate_limit", "drained"), notify_desktop="off",
             notify_terminal="off")  # fmt: skip


def watcher(store: Any, owner: str, *targets: Recorder) -> Watcher:
    w = Watcher(StubEngine(store, CFG, owner))  # type: ignore[arg-type]
    w.workers = [Worker(t) for t in targets]
    return w


@pytest.mark.anyio
async def test_kinds_done_per_task_rate_limits_drained_and_one_send_per_event(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "fleet.db"))
    everything, done_only = Recorder("all"), Recorder("done-only", ("done",))
    a = watcher(store, "engine-a", everything, done_only)
    twin = Recorder("twin")
    b = watcher(store, "engine-b", twin)  # a second engine on the same store
    running = (task("one", TaskStatus.RUNNING, notify_done=True), task("two", TaskStatus.RUNNING))
    finished = (task("one", TaskStatus.DONE, notify_done=True), task("two", TaskStatus.DONE))
    for w in (a, b):
        w.engine.snap = Snapshot(taken_at=0.0, tasks=running)  # type: ignore[attr-defined]
        for t in running:
            await w.handle(TaskChanged(t))
        for t in finished:
            await w.handle(TaskChanged(t))
    # "done" is not in notify_events: only the task that asked for it, and the done-only target
    assert everything.titles(1)[:1] == ["one done"]
    assert sorted(done_only.titles(2)) == ["one done", "two done"]
    reset = time.time() + 600
    limited = Gauges(rate_limits=(RateLimit(account="claude", status="rejected", resets_at=reset),))
    lifted = Gauges(rate_limits=(RateLimit(account="claude", status="allowed"),))
    for w in (a, b):
        w.engine.snap = Snapshot(taken_at=0.0, tasks=finished)  # type: ignore[attr-defined]
        for g in (limited, limited, lifted, lifted):
            await w.handle(GaugesChanged(g))
    titles = everything.titles(4)
    assert titles == ["one done", "claude rate-limited", "fleet drained: nothing left to run",
                      "claude rate limit lifted"]  # fmt: skip
    assert twin.got == []  # engine b saw every event too, and sent none of them
    await anyio.sleep(0.2)
    assert len(everything.got) == 4 and len(done_only.got) == 2
    stats = store.notification_stats()
    assert (stats.sent, stats.failed) == (5, 0)
    store.close()


def test_notify_entries_and_their_kinds(tmp_path: Path) -> None:
    assert split_entry("ntfys://topic") == (None, "ntfys://topic")
    assert split_entry("question,needs_human json://h/p?a=1,2") == (
        ("question", "needs_human"),
        "json://h/p?a=1,2",
    )
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        'notify = ["done json://127.0.0.1:9/x", "ntfys://t"]\nnotify_events = ["question", "done"]\n'
    )
    assert load_config(cfg).notify == ("done json://127.0.0.1:9/x", "ntfys://t")
    cfg.write_text('notify = ["questoin json://h/x"]\n')
    with pytest.raises(ConfigError, match=r"unknown kind 'questoin'.*did you mean 'question'"):
        load_config(cfg)
    cfg.write_text('notify = ["my-topic"]\n')
    with pytest.raises(ConfigError, match="not a notification URL"):
        load_config(cfg)
    cfg.write_text('notify_events = ["questions"]\n')
    with pytest.raises(ConfigError, match="unknown 'questions'"):
        load_config(cfg)


def test_terminal_sequences() -> None:
    n = Notice(
        key="k", kind="question", title="api asks", body="Which db; sqlite?", action="fleet-tui answer q-1 x"
    )
    assert terminal_sequence(n, "osc9", False) == "\x1b]9;api asks: Which db, sqlite?\x1b\\\a"
    assert terminal_sequence(n, "osc777", False) == "\x1b]777;notify;api asks;Which db, sqlite?\x1b\\\a"
    assert terminal_sequence(n, "bell", True) == "\a"
    assert (
        terminal_sequence(n, "osc9", True)
        == "\x1bPtmux;\x1b\x1b]9;api asks: Which db, sqlite?\x1b\x1b\\\x1b\\\a"
    )


@pytest.mark.anyio
async def test_the_engine_stopping_on_an_error_is_notified_once(tmp_path: Path) -> None:
    from tests.notify.receiver import Receiver

    from fleet_tui.notify import engine_failed

    rx = Receiver()
    store = SqliteStore(str(tmp_path / "fleet.db"))
    try:
        cfg = Config(notify=(rx.url(),), notify_desktop="off", notify_terminal="off")
        engine = StubEngine(store, cfg, "host:1:abc")
        await engine_failed(engine, RuntimeError("database disk image is malformed"))  # type: ignore[arg-type]
        await engine_failed(engine, RuntimeError("again"))  # type: ignore[arg-type]
        (post,) = rx.posts
        assert post["title"] == "fleet-tui engine stopped on an error"
        assert "RuntimeError: database disk image is malformed" in post["message"]
        assert "fleet-tui doctor" in post["message"]
        assert store.notification_stats().sent == 1
    finally:
        store.close()
        rx.close()


def test_notify_done_in_a_task_file(tmp_path: Path) -> None:
    from fleet_tui.taskfile import load_taskfile

    f = tmp_path / "tasks.toml"
    f.write_text('[[task]]\nname = "a"\nprompt = "p"\ncoder = "sim"\nnotify_done = true\n'
                 '[[task]]\nname = "b"\nprompt = "p"\ncoder = "sim"\nnotify_done = "yes"\n')  # fmt: skip
    res = load_taskfile(f, known_coders=["sim"])
    assert [str(e) for e in res.errors] == [f"{f}:10: notify_done must be true or false, got a string"]
    f.write_text('[[task]]\nname = "a"\nprompt = "p"\ncoder = "sim"\nnotify_done = true\n')
    (spec,) = load_taskfile(f, known_coders=["sim"]).specs
    assert spec.notify_done is True


def test_config_set_and_get_notify_urls_with_commas(tmp_path: Path) -> None:
    from fleet_tui.config import get_value, set_value

    cfg = tmp_path / "config.toml"
    set_value(cfg, "notify", "ntfys://topic?tags=a,b")  # one URL: never split on its commas
    assert get_value(cfg, "notify") == '["ntfys://topic?tags=a,b"]'
    set_value(cfg, "notify", '["question ntfys://a", "json://h/x?to=a,b"]')
    shown = get_value(cfg, "notify")
    set_value(cfg, "notify", shown)  # what get prints, set reads back
    assert load_config(cfg).notify == ("question ntfys://a", "json://h/x?to=a,b")


@pytest.mark.anyio
async def test_a_watcher_with_nowhere_to_send_reads_no_task_on_its_way_out(tmp_path: Path) -> None:
    """The final sweep (what the engine did last, still unread on the bus) is for sending; with
    no target and no desktop it read the whole queue for nothing as `run --until-idle` ended."""

    class Counting(SqliteStore):
        lists = 0

        def list_tasks(self, status: TaskStatus | None = None) -> list[Task]:
            Counting.lists += 1
            return super().list_tasks(status)

    class Subscribed(StubEngine):
        async def subscribe(self) -> Any:
            async for batch in self.bus.subscribe():
                yield batch

    store = Counting(str(tmp_path / "fleet.db"))
    store.add_tasks([TaskSpec(name=f"t{i}", prompt="p") for i in range(3)], time.time())
    engine = Subscribed(store, CFG, "engine-a")
    w = Watcher(engine)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(w.run)
            while not engine.bus.subscribers:
                await anyio.sleep(0.01)
            engine.bus.close()
    assert w.workers == [] and w.desktop is None
    assert Counting.lists == 0
    store.close()
