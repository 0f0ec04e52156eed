"""The cockpit's take-the-wheel keys: ``F`` sends a follow-up, ``A`` approves a parked task.

Why: the keys must reach the same store-level commands as ``fleet-tui send`` and ``approve``. The
cockpit runs on the fake engine for its view, with the commands served by a real Controller over
a temporary SQLite store, so the test reads back what a person's key press changed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_tui.scheduler.control import Controller
from fleet_tui.scheduler.humans import followup
from fleet_tui.scheduler.model import Snapshot, Task, TaskSpec
from fleet_tui.scheduler.states import TaskStatus
from fleet_tui.scheduler.store.opener import open_store
from fleet_tui.scheduler.store.protocol import Store
from fleet_tui.screens.confirm import ConfirmScreen
from fleet_tui.screens.followup import FollowUpScreen

from . import scenarios as sc
from .fake_engine import FakeEngine
from .helpers import wait_for

SIZE = (80, 24)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(None, str(tmp_path))
    yield s
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
    for name in ("store", "clock", "actor", "life", "get", "command", "retry", "wake"):
        setattr(engine, name, getattr(ctl, name))
    return engine


async def test_shift_f_sends_a_follow_up(store: Store, tmp_path: Path) -> None:
    t = parked_task(store, tmp_path, "job")
    app = sc.make_app(engine_on(store, [t]))
    async with app.run_test(size=SIZE) as pilot:
        assert app.queue.select_id(t.id)
        await pilot.pause()
        await pilot.press("F")
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
        await pilot.press("F")
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


DIFF = """ src/calc.py | 3 ++-
 1 file changed, 2 insertions(+), 1 deletion(-)

diff --git a/src/calc.py b/src/calc.py
index 1111111..2222222 100644
--- a/src/calc.py
+++ b/src/calc.py
@@ -10,3 +10,4 @@ def total(xs):
     s = 0
-    for x in xs: s += x
+    for x in xs:
+        s += x
     return s
"""


def test_diff_lines_carry_file_and_line() -> None:
    from fleet_tui.screens.review import diff_lines

    located = [(ln.where, ln.text) for ln in diff_lines(DIFF) if ln.file]
    assert located == [
        ("src/calc.py:10", "     s = 0"),
        ("src/calc.py:11 (removed line)", "-    for x in xs: s += x"),
        ("src/calc.py:11", "+    for x in xs:"),
        ("src/calc.py:12", "+        s += x"),
        ("src/calc.py:13", "     return s"),
    ]


async def test_review_comments_reach_the_follow_up(store: Store, tmp_path: Path) -> None:
    from textual.widgets import OptionList

    from fleet_tui.screens.detail import DetailScreen
    from fleet_tui.screens.review import ReviewScreen

    t = parked_task(store, tmp_path, "job")
    engine = engine_on(store, [t])
    engine.diffs[t.id] = DIFF
    app = sc.make_app(engine)
    async with app.run_test(size=(120, 36)) as pilot:
        assert app.queue.select_id(t.id)
        await pilot.pause()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen), "the detail screen")
        await pilot.press("3", "c")
        await wait_for(pilot, lambda: isinstance(app.screen, ReviewScreen), "the review dialog")
        lines = app.screen.query_one("#review-lines", OptionList)
        lines.highlighted = 3  # src/calc.py:12
        await pilot.press("enter")
        await pilot.press(*"use sum()", "enter")
        await wait_for(pilot, lambda: app.screen.comments, "the comment kept")  # type: ignore[attr-defined]
        await pilot.press("s")
        await wait_for(pilot, lambda: followup.pending(store, t.id), "the follow-up")
    (msg,) = followup.pending(store, t.id)
    assert "- src/calc.py:12 `s += x`: use sum()" in msg["text"], msg
    assert store.get_task(t.id).status == TaskStatus.QUEUED  # type: ignore[union-attr]


async def test_shift_t_takes_over_then_asks(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contextlib import nullcontext

    from fleet_tui.screens.takeover import TakeoverDoneScreen

    t = parked_task(store, tmp_path, "job")
    engine = engine_on(store, [t])
    engine.home = tmp_path  # type: ignore[attr-defined]
    engine.kill = Controller(store).kill  # type: ignore[method-assign]
    monkeypatch.delenv("TMUX", raising=False)
    monkeypatch.setenv("SHELL", "/bin/true")
    app = sc.make_app(engine)
    seen: list[tuple[list[str], str]] = []
    monkeypatch.setattr(app, "suspend", lambda: nullcontext())
    monkeypatch.setattr(app, "spawn_shell", lambda argv, cwd: seen.append((argv, cwd)) or 0)  # type: ignore[func-returns-value]
    async with app.run_test(size=SIZE) as pilot:
        assert app.queue.select_id(t.id)
        await pilot.pause()
        await pilot.press("T")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the confirmation")
        await pilot.press("y")
        await wait_for(pilot, lambda: isinstance(app.screen, TakeoverDoneScreen), "the question after it")
        assert seen == [(["/bin/true"], str(tmp_path))]
        taken = store.get_task(t.id)
        assert taken is not None and (taken.reason or "").startswith("taken over by "), taken
        await pilot.press("d")
        await wait_for(pilot, lambda: store.get_task(t.id).status == TaskStatus.DONE, "marked done")  # type: ignore[union-attr]
