"""The gauges pane (issue 22): bars coloured by state, a live countdown to each account's reset,
sparklines of the fleet's pulse, at 80x24, 120x36 and 200x60."""

from __future__ import annotations

from typing import Any

import pytest
from textual.pilot import Pilot

from fleet_tui.app.app import FleetApp

from . import scenarios as sc
from .helpers import wait_for

SIZES = [(80, 24), (120, 36), (200, 60)]


async def settle(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, FleetApp)
    await wait_for(pilot, lambda: app.stream.flushes or not app.stream.filling, "stream")
    await pilot.pause()


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_gauges_snapshot(snap_compare, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(sc.make_app(sc.gauges_fleet()), terminal_size=size, run_before=settle)


def bars(app: FleetApp) -> str:
    """The bars' text without the bars: ``claude held five_hour · resumes 16:30 (in 30m30s)``."""
    text = str(app.gauges.bars.render()).replace("█", " ").replace("░", " ")
    return "\n".join(" ".join(line.split()) for line in text.splitlines())


@pytest.mark.anyio
async def test_countdown_follows_the_clock_and_a_held_account_resumes() -> None:
    now = [sc.NOW]
    app = FleetApp(sc.gauges_fleet(), title="fleet-tui", clock=lambda: now[0])
    async with app.run_test(size=(200, 60)) as pilot:
        await settle(pilot)
        assert "claude held five_hour · resumes 16:30 (in 30m30s)" in bars(app)
        assert "codex 81% weekly · resets in 3h05m" in bars(app)
        now[0] += 75
        app.pull()
        await pilot.pause()
        assert "(in 29m15s)" in bars(app)
        rows = {r.key: r for r in app.gauges_rows()}
        assert rows["rate:claude"].state == "held"
        now[0] = sc.NOW + 1831  # past its reset
        app.pull()
        await pilot.pause()
        rows = {r.key: r for r in app.gauges_rows()}
        assert rows["rate:claude"].state == "ok"
        assert "resumes" not in bars(app) and "reset 16:30" in bars(app)


@pytest.mark.anyio
async def test_sparklines_per_host_on_demand() -> None:
    app = sc.make_app(sc.gauges_fleet())
    async with app.run_test(size=(200, 60)) as pilot:
        await settle(pilot)
        rows = app.gauges.pulse_rows
        assert [r.label.render().plain.split()[0] for r in rows] == [  # type: ignore[union-attr]
            "agents",
            "events/s",
            "tok/min",
            "$/hour",
        ]
        app.gauges.focus()
        await pilot.press("h")
        await wait_for(pilot, lambda: len(app.gauges.pulse_rows) > 4, "per-host sparklines")
        labels = [str(r.label.render()) for r in app.gauges.pulse_rows]
        assert [label.split()[:2] for label in labels[4:]] == [["box1", "agents"], ["box2", "agents"]]


@pytest.mark.anyio
async def test_an_accounts_label_is_cut_only_where_the_pane_has_no_room() -> None:
    """Paired lines (more gauges than the pane's height) cut a label only for want of room: a sim
    account's ``sim:sim-b`` read "sim:si" at every width."""
    from dataclasses import replace

    from fleet_tui.scheduler.model import RateLimit

    engine = sc.gauges_fleet()
    snap = engine.snapshot()
    held = RateLimit("sim:sim-b", "allowed", 0.5, sc.NOW + 600, "five_hour", sc.NOW - 60)
    engine.set_snapshot(replace(snap, gauges=replace(snap.gauges, rate_limits=(held,), rate_holds=())))
    app = sc.make_app(engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        shown = bars(app)
        assert "slots 3/4 load 2.4/core" in shown  # paired: two gauges a line
        assert "sim:sim-b 50%" in shown, shown
