"""The gauges pane (issue 22): bars coloured by state, a live countdown to each account's reset,
sparklines of the fleet's pulse, at 80x24, 120x36 and 200x60."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from rich.color import Color as RichColor
from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.color import Color
from textual.containers import Horizontal
from textual.geometry import Region
from textual.pilot import Pilot
from textual.renderables.sparkline import Sparkline as SparklineRenderable
from textual.strip import Strip
from textual.widgets import Sparkline, Static

from fleet_tui.app.app import FleetApp
from fleet_tui.app.panes import PulseLines, sparkline
from fleet_tui.gauges import Pulse, gauges
from fleet_tui.scheduler.series import KEEP

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
        assert [label.split()[0] for label in app.gauges.pulse_labels] == [
            "agents",
            "events/s",
            "tok/min",
            "$/hour",
        ]
        app.gauges.focus()
        await pilot.press("h")
        await wait_for(pilot, lambda: len(app.gauges.pulse_labels) > 4, "per-host sparklines")
        labels = app.gauges.pulse_labels
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


def cells(app: FleetApp, region: Region) -> list[list[tuple[str, Style]]]:
    """The screen's cells in ``region`` as drawn: each character and its style (without the
    meta data Textual's own widgets attach for the mouse)."""
    strips = app.screen._compositor.render_strips()[region.y : region.bottom]
    return [
        [
            (ch, seg.style.clear_meta_and_links() if seg.style else Style())
            for seg in strip.crop(region.x, region.right)
            for ch in seg.text
        ]
        for strip in strips
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("theme", ["textual-dark", "textual-light"])
async def test_the_pulse_lines_are_drawn_as_textuals_own_label_and_sparkline_widgets(theme: str) -> None:
    """One widget draws every pulse line (nine widgets did: a full repaint walked and cut each);
    each line is what a 22-cell label and Textual's ``Sparkline`` widget beside it draw, in the
    pane's colours, cell for cell and style for style."""
    app = sc.make_app(sc.gauges_fleet())
    async with app.run_test(size=(160, 48)) as pilot:
        app.theme = theme
        await settle(pilot)
        pulse = app.gauges.pulse
        assert len(pulse.labels) >= 3  # as many as the pane has lines left for
        region = pulse.region
        assert region.width > PulseLines.LABEL_WIDTH
        ours = cells(app, region)

        # the same lines from textual's widgets, in the colours fleet.tcss gives the pulse
        colors = app.theme_variables
        muted = Color.parse(colors["foreground-muted"])
        accent, primary = Color.parse(colors["accent"]), Color.parse(colors["primary"]).with_alpha(0.5)
        rows = []
        for label, p in zip(pulse.labels, pulse._pulses, strict=True):
            text = Static(Text(label, no_wrap=True))
            text.styles.width = PulseLines.LABEL_WIDTH
            text.styles.color = muted
            values = list(p.values)
            line = Sparkline([0.0] * (KEEP - len(values)) + values, min_color=primary, max_color=accent)
            line.styles.width = "1fr"
            row = Horizontal(text, line)
            row.styles.height = 1
            rows.append(row)
        pulse.display = False
        await app.gauges.mount_all(rows)
        await pilot.pause()
        assert rows[0].region.y == region.y
        assert cells(app, region) == ours


@pytest.mark.anyio
async def test_the_pulse_lines_are_drawn_once_for_many_repaints() -> None:
    app = sc.make_app(sc.gauges_fleet())
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        pulse = app.gauges.pulse
        draws = 0
        draw = pulse._draw

        def counted(p: Pulse, *rest: Any) -> Strip:
            nonlocal draws
            draws += 1
            return draw(p, *rest)

        pulse._draw = counted  # type: ignore[method-assign,assignment]
        for _ in range(3):  # full repaints, as closing a dialog does
            app.screen.refresh()
            await pilot.pause()
            app.screen._compositor.render_strips()
        assert draws == 0
        pulse.set([replace(p, now=p.now + "1") for p in pulse._pulses])
        await pilot.pause()
        app.screen._compositor.render_strips()
        assert draws == len(pulse.labels) >= 3
        # a snapshot that moves one line's figures draws that line, and keeps the others
        first, *rest = pulse._pulses
        pulse.set([replace(first, values=(*first.values[1:], first.values[-1] + 1.0)), *rest])
        await pilot.pause()
        app.screen._compositor.render_strips()
        assert draws == len(pulse.labels) + 1


@pytest.mark.parametrize("n", [0, 1, 2, 3, 50, 119, KEEP, 121, 300])
def test_a_sparkline_line_is_textuals_cell_for_cell(n: int) -> None:
    """``panes.sparkline`` draws what Textual's ``Sparkline`` renderable draws (one line, the
    largest value per cell), without the console's render pipeline: the same characters in the
    same styles, for short and long data, many widths and repeated values."""
    rng = random.Random(n)
    low, high = RichColor.parse("#123456"), RichColor.parse("#fedcba")
    console = Console(width=200)
    for _ in range(60):
        width = rng.randint(1, 180)
        data = [rng.choice([0.0, 1.0, rng.random() * 100, float(rng.randint(0, 5))]) for _ in range(n)]
        spark = SparklineRenderable(
            data, width=width, height=1, min_color=low, max_color=high, summary_function=max
        )
        (theirs,) = console.render_lines(spark, console.options.update(width=width, height=1), pad=True)
        assert _cells(sparkline(data, width, low, high)) == _cells(theirs), (n, width)


def _cells(segments: list[Segment]) -> list[tuple[str, Style | None]]:
    return [(ch, seg.style) for seg in segments for ch in seg.text]


@pytest.mark.anyio
async def test_figures_that_move_under_what_is_drawn_draw_nothing() -> None:
    """Free memory moves by bytes and the load by hundredths every second, while the lines drawn
    from them mostly stay: a snapshot like that refreshes neither the bars nor the pane (an idle
    cockpit's second), and one that moves a number drawn redraws the bars."""
    app = sc.make_app(sc.gauges_fleet())
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        pane = app.gauges
        refreshed: list[str] = []
        for widget, name in ((pane, "pane"), (pane.bars, "bars")):
            own = widget.refresh

            def counted(*args: Any, own: Any = own, name: str = name, **kwargs: Any) -> Any:
                refreshed.append(name)
                return own(*args, **kwargs)

            widget.refresh = counted  # type: ignore[method-assign]
        snap, now = pane.snap, pane.now
        assert snap is not None
        g = snap.gauges
        mem, load = g.mem_available, g.load_per_core
        assert mem is not None and load is not None
        drawn = str(pane.bars.render())
        for step in range(1, 4):
            moved = replace(g, mem_available=mem + step, load_per_core=load + 0.001 * step)
            pane.show(replace(snap, gauges=moved), now)
            await pilot.pause()
        assert pane.figures[0] != tuple(gauges(snap, now))  # the figures did move
        assert refreshed == []
        pane.show(replace(snap, gauges=replace(g, load_per_core=load + 0.5)), now)
        await pilot.pause()
        assert refreshed == ["bars"]
        assert str(pane.bars.render()) != drawn
        assert f"{load + 0.5:.1f}/core" in str(pane.bars.render())
