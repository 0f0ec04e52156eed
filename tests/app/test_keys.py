"""Pilot tests: every cockpit key sends the right command to the (fake) engine.

No real engine, no sleeps: the app runs headless against FakeEngine and each test waits for the
recorded call (or the screen) it expects.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace

import pytest
from textual import events

from fleet_tui.app.app import FleetApp
from fleet_tui.screens.confirm import ConfirmScreen
from fleet_tui.screens.quit import QuitScreen

from . import scenarios as sc
from .helpers import KEY_NAMES, wait_for

pytestmark = pytest.mark.anyio

SIZE = (80, 24)


async def select(pilot, app: FleetApp, task_id: str) -> None:  # type: ignore[no-untyped-def]
    assert app.queue.select_id(task_id)
    await pilot.pause()
    assert app.queue.selected_id == task_id


@pytest.mark.parametrize(
    ("key", "verb", "task_id"),
    [("k", "kill", "t-0002"), ("c", "cancel", "t-0004")],
)
async def test_destructive_keys_confirm_first(key: str, verb: str, task_id: str) -> None:
    engine = sc.several_running()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await select(pilot, app, task_id)
        await pilot.press(key)
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), "confirm dialog")
        assert engine.calls == []
        await pilot.press("escape")  # declined: nothing sent
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        assert engine.calls == []
        await pilot.press(key)
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await wait_for(pilot, lambda: engine.calls, verb)
        assert engine.calls == [(verb, (task_id,))]


async def test_merge_confirms_with_diffstat() -> None:
    engine = sc.parked()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await select(pilot, app, "t-0201")
        await pilot.press("m")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), "merge dialog")
        assert isinstance(app.screen, ConfirmScreen)
        assert "2 files changed" in app.screen.body
        assert "diff --git" not in app.screen.body
        assert engine.calls == []
        await pilot.press("y")
        await wait_for(pilot, lambda: engine.calls, "merge")
        assert engine.calls == [("merge", ("t-0201",))]


async def test_pause_and_resume_one_task() -> None:
    engine = sc.parked()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await select(pilot, app, "t-0203")  # paused -> resume
        await pilot.press("p")
        await wait_for(pilot, lambda: engine.calls)
        assert engine.calls == [("resume", ("t-0203",))]
    engine = sc.several_running()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await select(pilot, app, "t-0002")  # running -> pause
        await pilot.press("p")
        await wait_for(pilot, lambda: engine.calls)
        assert engine.calls == [("pause", ("t-0002",))]
        await select(pilot, app, "t-0001")  # done: refused locally, nothing sent
        await pilot.press("p")
        await pilot.pause()
        assert engine.calls == [("pause", ("t-0002",))]


async def test_pause_and_resume_fleet_follows_snapshot() -> None:
    engine = sc.several_running()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("P")
        await wait_for(pilot, lambda: len(engine.calls) == 1)
        engine.set_paused(True)
        await pilot.press("P")
        await wait_for(pilot, lambda: len(engine.calls) == 2)
        assert engine.calls == [("pause", (None,)), ("resume", (None,))]


async def test_retry_and_message_is_notified() -> None:
    engine = sc.parked()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await select(pilot, app, "t-0201")
        await pilot.press("r")
        await wait_for(pilot, lambda: engine.calls)
        assert engine.calls == [("retry", ("t-0201",))]
        await wait_for(pilot, lambda: app._notifications, "notification")
        assert any("retry t-0201: ok" in n.message for n in app._notifications)


async def test_shell_opens_in_workdir(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = sc.several_running()
    app = sc.make_app(engine)
    seen: list[tuple[list[str], str]] = []
    monkeypatch.setenv("SHELL", "/bin/true")
    monkeypatch.setattr(app, "suspend", lambda: nullcontext())
    monkeypatch.setattr(app, "spawn_shell", lambda argv, cwd: seen.append((argv, cwd)) or 0)  # type: ignore[func-returns-value]
    async with app.run_test(size=SIZE) as pilot:
        await select(pilot, app, "t-0002")
        await pilot.press("s")
        await pilot.pause()
        assert seen == [(["/bin/true"], "/tmp")]
        await select(pilot, app, "t-0004")  # queued: no workdir yet
        await pilot.press("s")
        await pilot.pause()
        assert len(seen) == 1


@pytest.mark.parametrize(("choice", "leave"), [("l", True), ("x", False)])
async def test_quit_with_running_agents_asks(choice: str, leave: bool) -> None:
    engine = sc.several_running()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, QuitScreen), "quit dialog")
        await pilot.press(choice)
        await wait_for(pilot, lambda: engine.shutdown_calls, "shutdown")
    assert engine.shutdown_calls == [leave]


async def test_quit_cancel_keeps_running() -> None:
    engine = sc.several_running()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, QuitScreen))
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, QuitScreen))
        assert engine.shutdown_calls == []
        assert app.is_running


@pytest.mark.parametrize(("on_quit", "leave"), [("leave", True), ("stop", False)])
async def test_quit_policy_skips_question(on_quit: str, leave: bool) -> None:
    engine = sc.several_running()
    app = sc.make_app(engine, on_quit=on_quit)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await wait_for(pilot, lambda: engine.shutdown_calls, "shutdown")
        assert not isinstance(app.screen, QuitScreen)
    assert engine.shutdown_calls == [leave]


async def test_quit_idle_fleet_does_not_ask() -> None:
    engine = sc.empty()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await wait_for(pilot, lambda: engine.shutdown_calls, "shutdown")
    assert engine.shutdown_calls == [True]


async def test_typing_in_filter_does_not_trigger_commands() -> None:
    engine = sc.several_running()
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("slash", "k", "p", "r", "c", "m", "q")
        await pilot.pause()
        assert engine.calls == []
        assert not isinstance(app.screen, ConfirmScreen | QuitScreen)


async def test_keys_typed_right_after_slash_or_a_go_to_the_input(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fast typing (or a paste) queues keys before focus moves: none may reach a cockpit binding."""
    engine = sc.with_question()
    app = sc.make_app(engine)
    shells: list[str] = []
    monkeypatch.setattr(app, "suspend", lambda: nullcontext())
    monkeypatch.setattr(app, "spawn_shell", lambda argv, cwd: shells.append(cwd) or 0)  # type: ignore[func-returns-value]
    async with app.run_test(size=SIZE) as pilot:
        await select(pilot, app, "t-0002")
        for ch in "/state:run":
            app.post_message(events.Key(KEY_NAMES.get(ch, ch), ch))
        await pilot.pause()
        assert app.filter_input.value == "state:run"
        await pilot.press("enter")
        await pilot.pause()
        for ch in "akp":  # answer, then type: "k" and "p" belong to the answer form now
            app.post_message(events.Key(ch, ch))
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        assert engine.calls == [] and shells == []


async def test_quit_asks_about_this_engines_agents_only() -> None:
    """Another engine on the same store runs its agents whatever this cockpit does: the quit
    dialog counts the agents quitting stops or leaves, and with none of its own it does not ask."""
    engine = sc.several_running()
    snap = engine.snapshot()
    owners = {"t-0002": "engine-a", "t-0003": "engine-b", "t-0005": "engine-b"}
    tasks = tuple(replace(t, owner=owners.get(t.id)) for t in snap.tasks)
    engine.set_snapshot(replace(snap, tasks=tasks))
    engine.owner = "engine-a"  # type: ignore[attr-defined]
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, QuitScreen), "quit dialog")
        assert isinstance(app.screen, QuitScreen) and app.screen.running == 1
        await pilot.press("escape")
    engine = sc.several_running()
    engine.set_snapshot(replace(snap, tasks=tuple(replace(t, owner="engine-b") for t in snap.tasks)))
    engine.owner = "engine-a"  # type: ignore[attr-defined]
    app = sc.make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await wait_for(pilot, lambda: engine.shutdown_calls, "shutdown")
        assert not isinstance(app.screen, QuitScreen)
    assert engine.shutdown_calls == [True]
