"""The detail screen (issue 15, point 17) shows at once and follows its task while it is open."""

from __future__ import annotations

import asyncio
import io
from dataclasses import replace

import pytest
from rich.console import Console
from textual.widgets import RichLog, Static

from fleet_tui.app.app import FleetApp
from fleet_tui.scheduler.model import AgentEvent, Attempt, Event, TaskChanged, Transition
from fleet_tui.screens.detail import DetailScreen

from . import scenarios as sc
from .fake_engine import FakeEngine
from .helpers import wait_for

pytestmark = pytest.mark.anyio


def rendered(widget: Static) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(widget.content)
    return console.export_text()


class SlowEngine(FakeEngine):
    """Every history call waits until the test opens the gate (git on a big repo, a busy store)."""

    def __init__(self, base: FakeEngine) -> None:
        super().__init__(base.snapshot())
        self.__dict__.update(
            {k: v for k, v in base.__dict__.items() if k.endswith("_by_task") or k == "diffs"}
        )
        self.gate = asyncio.Event()

    async def diff(self, ref: str) -> str:
        await self.gate.wait()
        return await super().diff(ref)

    async def events(self, ref: str, attempt: int | None = None, limit: int = 2000) -> list[Event]:
        await self.gate.wait()
        return await super().events(ref, attempt, limit)

    async def attempts(self, ref: str) -> list[Attempt]:
        await self.gate.wait()
        return await super().attempts(ref)

    async def transitions(self, ref: str) -> list[Transition]:
        await self.gate.wait()
        return await super().transitions(ref)


async def test_detail_shows_at_once_and_loads_the_rest_in_workers() -> None:
    engine = SlowEngine(sc.parked())
    app = sc.make_app(engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen), "detail")
        screen = app.screen
        assert isinstance(screen, DetailScreen)
        await pilot.pause()
        # nothing has come back from the engine yet, and the task is already on screen
        overview = rendered(screen.query_one("#overview", Static))
        assert "verify_failed" in overview and "Do the payments work." in overview
        assert "loading" in rendered(screen.query_one("#diff", Static))
        assert not screen.loaded
        engine.gate.set()
        await wait_for(pilot, lambda: screen.loaded and screen.transitions, "history loaded")
        await wait_for(pilot, lambda: "def refund" in rendered(screen.query_one("#diff", Static)), "diff")


async def test_detail_follows_the_running_task() -> None:
    engine = sc.several_running()
    now = [sc.NOW]
    app = FleetApp(engine, title="fleet-tui", clock=lambda: now[0])
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: engine.subscribers, "subscription")
        app.queue.select_id("t-0002")
        await pilot.pause()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen), "detail")
        screen = app.screen
        assert isinstance(screen, DetailScreen)
        await wait_for(pilot, lambda: screen.loaded, "log loaded")
        assert "40s" in rendered(screen.query_one("#overview", Static))

        # time passes, the agent works: tokens grow, a new event arrives, then it verifies
        now[0] += 60
        task = app.tasks["t-0002"]
        engine.push(
            TaskChanged(replace(task, tokens=55_000, updated_at=now[0])),
            AgentEvent(Event("t-0002", 2, 10, now[0], "text", text="tests pass now")),
        )
        await wait_for(pilot, lambda: "55k" in rendered(screen.query_one("#overview", Static)), "tokens live")
        assert "1m40s" in rendered(screen.query_one("#overview", Static))  # the clock moved on
        await wait_for(pilot, lambda: screen.events[-1].text == "tests pass now", "the new event in the log")
        await pilot.press("4")
        log = screen.query_one("#log", RichLog)
        await wait_for(pilot, lambda: log.lines and "tests pass now" in log.lines[-1].text, "the log drawn")
        assert sum("tests pass now" in line.text for line in log.lines) == 1
        engine.transitions_by_task["t-0002"] = [
            Transition("t-0002", now[0], "running", "verifying", None, 2, "box1")
        ]
        from fleet_tui.scheduler.states import TaskStatus

        engine.push(TaskChanged(replace(task, status=TaskStatus.VERIFYING, updated_at=now[0] + 1)))
        await wait_for(
            pilot,
            lambda: "running -> verifying" in rendered(screen.query_one("#overview", Static)),
            "transitions",
        )
