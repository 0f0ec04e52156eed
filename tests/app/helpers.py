"""Small helpers for Pilot tests: wait for a condition without sleeping, type text."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from rich.console import RenderableType
from textual.pilot import Pilot

from fleet_tui.app.app import FleetApp
from fleet_tui.app.scrollbars import SteadyScrollBar
from fleet_tui.app.stream import FILL_LIMIT
from fleet_tui.scheduler.model import Event

from . import scenarios as sc

KEY_NAMES = {" ": "space", "/": "slash", ":": "colon", "-": "minus", "?": "question_mark", ",": "comma",
             "!": "exclamation_mark", ".": "full_stop", "_": "underscore"}  # fmt: skip


async def wait_for(pilot: Pilot[Any], condition: Callable[[], object], what: str = "condition") -> None:
    """Let the app process messages until ``condition()`` holds (bounded; no sleeps)."""
    for _ in range(400):
        if condition():
            return
        await pilot.pause()
    raise AssertionError(f"timed out waiting for {what}")


def count_renders(bar: SteadyScrollBar) -> list[object]:
    """``bar``'s appearance each time it is drawn through its renderable from now on (a drawing
    it keeps, or puts together from its kept rows, is not counted)."""
    renders: list[object] = []
    render = bar.render

    def counted() -> RenderableType:
        renders.append(bar.appearance())
        return render()

    bar.render = counted  # type: ignore[method-assign]
    return renders


async def type_text(pilot: Pilot[Any], text: str) -> None:
    await pilot.press(*(KEY_NAMES.get(ch, ch) for ch in text))


@asynccontextmanager
async def following_200_lines() -> AsyncIterator[tuple[FleetApp, Pilot[None], sc.FakeEngine]]:
    """A wide cockpit whose stream follows a running task's 200 stored lines, drawn."""
    engine = sc.several_running()
    engine.events_by_task["t-0002"] = [
        Event("t-0002", 2, i, sc.NOW, "text", text=f"line {i:03d}") for i in range(FILL_LIMIT)
    ]
    app = sc.make_app(engine)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: engine.subscribers)
        app.queue.select_id("t-0002")
        await wait_for(pilot, lambda: app.stream.task_id == "t-0002" and app.stream.flushes, "fill")
        await pilot.pause()
        yield app, pilot, engine
