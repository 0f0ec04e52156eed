"""Screenshots of the cockpit (pytest-textual-snapshot) at 80x24 and 160x48.

Each scenario pins ids and the clock (``scenarios.NOW``, TZ=UTC), so elapsed times and reset
times are stable. Update after an intended change with ``pytest tests/app --snapshot-update`` and
look at the new SVGs before committing them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from textual.pilot import Pilot

from fleet_tui.app.app import FleetApp
from fleet_tui.screens.detail import DetailScreen

from . import scenarios as sc
from .fake_engine import FakeEngine
from .helpers import wait_for

SIZES = [(80, 24), (160, 48)]


async def settle(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, FleetApp)
    await pilot.pause()
    if app.stream.task_id is not None:
        await wait_for(pilot, lambda: not app.stream.filling, "stream fill")
    await pilot.pause()


async def select_user_api(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, FleetApp)
    app.queue.select_id("t-0002")
    await wait_for(pilot, lambda: app.stream.flushes, "stream fill")
    await settle(pilot)


async def open_detail(pilot: Pilot[Any]) -> None:
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, DetailScreen), "detail")
    screen = pilot.app.screen
    assert isinstance(screen, DetailScreen)
    await wait_for(pilot, lambda: screen.events, "detail loaded")
    await pilot.pause()


SCENARIOS: dict[str, tuple[Callable[[], FakeEngine], Callable[[Pilot[Any]], Awaitable[None]]]] = {
    "empty": (sc.empty, settle),
    "running": (sc.several_running, select_user_api),
    "question": (sc.with_question, settle),
    "rate_limited": (sc.rate_limited, settle),
    "parked": (sc.parked, settle),
    "detail": (sc.parked, open_detail),
}


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_snapshot(snap_compare, name: str, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    make_engine, before = SCENARIOS[name]
    app = sc.make_app(make_engine())
    assert snap_compare(app, terminal_size=size, run_before=before)
