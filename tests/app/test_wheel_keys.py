"""The cockpit's take-the-wheel keys: ``f`` sends a follow-up, ``A`` approves a parked task.

Why: the keys must reach the same store-level commands as ``fleet-tui send`` and ``approve``. The
cockpit runs on the fake engine for its view, with the commands served by a real Controller over
a temporary SQLite store, so the test reads back what a person's key press changed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_tui.scheduler import followup
from fleet_tui.scheduler.control import Controller
from fleet_tui.scheduler.model import Snapshot, Task, TaskSpec
from fleet_tui.scheduler.states import TaskStatus
from fleet_tui.scheduler.store import Store, open_store
from fleet_tui.screens.confirm import ConfirmScreen
from fleet_tui.screens.followup import FollowUpScreen

from . import scenarios as sc
from .fake_engine import FakeEngine
from .helpers import wait_for

SIZE = (80, 24)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = open_store(None, str(tmp_path))
    yield s  # type: ignore[misc]
    s.close()


def parked_task(store: Store, tmp_path: Path, name: str) -> Task:
    [t] = store.add_tasks(
        [TaskSpec(name=name, prompt="p", cwd=str(tmp_path), coder="shell", command="true")], 1.0
    )
    moved = store.transition(
        t.id, TaskStatus.NEEDS_HUMAN, reason="verify_failed: run: false", now=2.0, expect=[TaskStatus.QUEUED]
    )
    assert moved is not None
    return moved


def engine_on(store: Store, tasks: list[Task]) -> FakeEngine:
    engine = FakeEngine(
        Snapshot(taken_at=sc.NOW, tasks=tuple(tasks), hosts=(sc.HOST,), gauges=sc.base_gauges())
    )
    ctl = Controller(store, actor="cockpit")
    for name in ("store", "clock", "actor", "_get", "_direct", "retry"):
        setattr(engine, name, getattr(ctl, name))
    return engine


async def test_f_sends_a_follow_up(store: Store, tmp_path: Path) -> None:
    t = parked_task(store, tmp_path, "job")
    app = sc.make_app(engine_on(store, [t]))
    async with app.run_test(size=SIZE) as pilot:
        assert app.queue.select_id(t.id)
        await pilot.pause()
        await pilot.press("f")
        await wait_for(pilot, lambda: isinstance(app.screen, FollowUpScreen), "the follow-up dialog")
        await pilot.press(*"add tests", "enter")
        await wait_for(pilot, lambda: store.get_task(t.id).status == TaskStatus.QUEUED, "requeued")  # type: ignore[union-attr]
    assert [m["text"] for m in followup.pending(store, t.id)] == ["add tests"]


async def test_escape_sends_nothing(store: Store, tmp_path: Path) -> None:
    t = parked_task(store, tmp_path, "job")
    app = sc.make_app(engine_on(store, [t]))
    async with app.run_test(size=SIZE) as pilot:
        assert app.queue.select_id(t.id)
        await pilot.pause()
        await pilot.press("f")
        await wait_for(pilot, lambda: isinstance(app.screen, FollowUpScreen), "the follow-up dialog")
        await pilot.press("x", "escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, FollowUpScreen), "dialog closed")
    assert store.get_task(t.id).status == TaskStatus.NEEDS_HUMAN  # type: ignore[union-attr]
    assert followup.pending(store, t.id) == []


async def test_shift_a_approves_after_confirming(store: Store, tmp_path: Path) -> None:
    t = parked_task(store, tmp_path, "job")
    app = sc.make_app(engine_on(store, [t]))
    async with app.run_test(size=SIZE) as pilot:
        assert app.queue.select_id(t.id)
        await pilot.pause()
        await pilot.press("A")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the confirmation")
        await pilot.press("y")
        await wait_for(pilot, lambda: store.get_task(t.id).status == TaskStatus.DONE, "approved")  # type: ignore[union-attr]
    assert (store.get_task(t.id).reason or "").startswith("approved_by:")  # type: ignore[union-attr]
