"""The main screen's compositor writes what Textual's own writes, from fewer rows
(``app/compositor.py``)."""

from __future__ import annotations

import copy
import random

from textual._compositor import Compositor
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

from fleet_tui.app.compositor import SpanCompositor

from .helpers import following_200_lines


def _textuals(compositor: SpanCompositor) -> Compositor:
    """``compositor`` as Textual's own: the same layout, its own methods."""
    plain: Compositor = copy.copy(compositor)
    plain.__class__ = Compositor
    return plain


def _updates(rng: random.Random, compositor: Compositor, count: int) -> list[set[Region]]:
    """Sets of changed regions as a screen's widgets give them (a widget's clip, some of its
    rows, a line or a few cells of it), and a few anywhere on the screen."""
    screen = compositor.size.region
    areas = [region.intersection(clip) for region, clip in compositor.visible_widgets.values()]
    areas = [area for area in areas if area]
    updates = []
    for _ in range(count):
        regions: set[Region] = set()
        for _ in range(rng.randint(1, 5)):
            if rng.random() < 0.15:
                x, y = rng.randrange(screen.width), rng.randrange(screen.height)
                regions.add(Region(x, y, rng.randint(1, screen.width - x), rng.randint(1, screen.height - y)))
                continue
            area = rng.choice(areas)
            y = rng.randrange(area.y, area.bottom)
            shape = rng.random()
            if shape < 0.3:
                regions.add(area)
            elif shape < 0.6:
                regions.add(Region(area.x, y, area.width, rng.randint(1, area.bottom - y)))
            else:
                x = rng.randrange(area.x, area.right)
                regions.add(Region(x, y, rng.randint(1, area.right - x), 1))
        updates.append(regions)
    return updates


async def test_an_update_reaches_the_terminal_as_the_same_bytes_as_textuals_compositor_writes() -> None:
    """Hundreds of updates of the cockpit's screen (a live stream beside the queue, the panes
    below): each one written by the main screen's compositor is the same bytes Textual's own
    writes, and asks the widgets for fewer rows; a whole screen is the same lines."""
    async with following_200_lines() as (app, _pilot, _engine):
        ours = app.screen._compositor
        assert isinstance(ours, SpanCompositor)
        theirs = _textuals(ours)
        rows = {"ours": 0, "theirs": 0}

        original = Widget.render_lines

        def counted(whose: str) -> None:
            """From now on, the rows asked of widgets count as ``whose``."""

            def counting(widget: Widget, crop: Region) -> list[Strip]:
                rows[whose] += crop.height
                return original(widget, crop)

            Widget.render_lines = counting  # type: ignore[method-assign,assignment]

        console = app.console
        try:
            for regions in _updates(random.Random(14), ours, 400):
                counted("ours")
                ours._dirty_regions = set(regions)
                mine = ours.render_partial_update()
                counted("theirs")
                theirs._dirty_regions = set(regions)
                textuals = theirs.render_partial_update()
                Widget.render_lines = original  # type: ignore[method-assign]
                assert mine is not None and textuals is not None
                assert mine.render_segments(console) == textuals.render_segments(console), regions
        finally:
            Widget.render_lines = original  # type: ignore[method-assign]
        assert rows["ours"] < rows["theirs"] / 2, rows
        assert ours.render_strips() == theirs.render_strips()
