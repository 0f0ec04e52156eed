"""Screenshots of the queue at 80x24, 120x36 and 200x60: a 10,000-task fleet over 20 repositories
(group headers with counts, needs-you first, finished folded) and long names that share a prefix
(names whole, columns given up rather than cut, ``? help`` and ``q quit`` always in the footer).

Update after an intended change with ``pytest tests/app/test_queue_snapshots.py --snapshot-update``
and look at the new SVGs before committing them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from textual.pilot import Pilot

from fleet_tui.app.app import FleetApp

from . import scenarios as sc
from .fake_engine import FakeEngine
from .queue_fleet import big_fleet, long_names

SIZES = [(80, 24), (120, 36), (200, 60)]


async def settle(pilot: Pilot[Any]) -> None:
    await pilot.pause()
    await pilot.pause()


async def folded_group(pilot: Pilot[Any]) -> None:
    """Fold the first repository and show finished tasks: the header's arrow and counts."""
    app = pilot.app
    assert isinstance(app, FleetApp)
    await pilot.pause()
    await pilot.press("space", "f")
    await pilot.pause()


SCENARIOS: dict[str, tuple[Callable[[], FakeEngine], Callable[[Pilot[Any]], Awaitable[None]]]] = {
    "scale": (big_fleet, settle),
    "scale_folded": (big_fleet, folded_group),
    "long_names": (long_names, settle),
}


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_queue_snapshot(snap_compare, name: str, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    make_engine, before = SCENARIOS[name]
    app = sc.make_app(make_engine())
    assert snap_compare(app, terminal_size=size, run_before=before)
