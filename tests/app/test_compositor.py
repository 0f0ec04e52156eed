"""The main screen's compositor writes what Textual's own writes, from fewer rows
(``app/compositor.py``)."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable

from rich.console import Console, RenderableType
from textual._compositor import Compositor, LayoutUpdate
from textual.geometry import Region
from textual.screen import Screen
from textual.strip import Strip
from textual.widget import Widget

from fleet_tui.app.compositor import SpanCompositor
from fleet_tui.scheduler.model import AgentEvent, Event
from fleet_tui.screens.help import HelpScreen

from . import scenarios as sc
from .helpers import following_200_lines, wait_for


def _textuals(compositor: SpanCompositor) -> Compositor:
    """``compositor`` as Textual's own: the same layout, its own methods."""
    plain: Compositor = copy.copy(compositor)
    plain.__class__ = Compositor
    return plain


def _textuals_whole(compositor: SpanCompositor, console: Console) -> str:
    """The bytes of Textual's own whole draw of the screen ``compositor`` composes, now."""
    region = compositor.size.region
    chops = _textuals(compositor)._render_chops(region, lambda y: True)
    return LayoutUpdate([list(chop.values()) for chop in chops], region).render_segments(console)


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


async def test_a_closed_dialog_uncovers_the_screen_drawn_from_its_kept_frame() -> None:
    """Closing a dialog draws the whole screen from the frame the compositor kept, asking the
    widgets for no row: the screen as it was, what changed behind the dialog drawn in the frame
    after, when the kept frame is the lines Textual's own whole draw gives. A new CSS (a theme)
    drops the frame: the next close is Textual's whole draw again; so does a new size."""
    async with following_200_lines() as (app, pilot, engine):
        ours = app.screen._compositor
        assert isinstance(ours, SpanCompositor)
        main = app.screen
        console = app.console
        drawn: list[tuple[str, str, int]] = []  # (ours, Textual's, rows asked) per whole update
        rows = [0]
        original = Widget.render_lines

        def counting(widget: Widget, crop: Region) -> list[Strip]:
            rows[0] += crop.height
            return original(widget, crop)

        shown = app._display

        def display(screen: Screen[object], update: RenderableType | None) -> None:
            if screen is main and isinstance(update, LayoutUpdate):
                Widget.render_lines = original  # type: ignore[method-assign]
                drawn.append((update.render_segments(console), _textuals_whole(ours, console), rows[0]))
            shown(screen, update)

        app._display = display  # type: ignore[method-assign,assignment]

        async def close_help(while_covered: Callable[[], None]) -> tuple[str, str, int]:
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "help")
            while_covered()
            before = len(drawn)
            rows[0] = 0
            Widget.render_lines = counting  # type: ignore[method-assign,assignment]
            try:
                await pilot.press("escape")
                await wait_for(pilot, lambda: len(drawn) > before, "the uncovering draw")
            finally:
                Widget.render_lines = original  # type: ignore[method-assign]
            return drawn[before]

        # the frame follows partial updates: new stream lines, the cursor's moves
        for i in range(5):
            engine.push(AgentEvent(Event("t-0002", 2, 300 + i, sc.NOW, "text", text=f"live {i}")))
            await wait_for(pilot, lambda i=i: f"live {i}" in app.stream.lines[-1].text, "live line")  # type: ignore[misc]
        await pilot.press("down", "down", "up")
        await pilot.pause()

        def retitle() -> None:  # a pane drawn anew while covered (not held for the next frame)
            app.inbox.border_title = "retitled while covered"

        def kept_and_textuals() -> tuple[str, str]:
            """The kept frame's lines and Textual's whole draw, now."""
            region = ours.size.region
            frame = ours._current_frame()
            assert frame is not None
            kept = LayoutUpdate([list(line.values()) for line in frame], region)
            return kept.render_segments(console), _textuals_whole(ours, console)

        # the close shows the screen as it was, at once: what changed behind it comes a frame later
        mine, textuals, retitled = await close_help(retitle)
        assert "retitled while covered" not in mine and "retitled while covered" in textuals
        await wait_for(pilot, lambda: "retitled while covered" in kept_and_textuals()[0], "the next frame")
        kept, textuals = kept_and_textuals()
        assert kept == textuals

        # the lines held while covered came in the frame after; the next close shows them too
        mine, textuals, unchanged = await close_help(lambda: None)
        assert mine == textuals

        app._invalidate_css()  # what a new theme does first: the kept frame is not used
        mine, textuals, whole = await close_help(lambda: None)
        assert mine == textuals
        # rows asked of the widgets by the closes: none (the retitled inbox's came after), against
        # every one of them
        assert retitled == unchanged == 0 and whole > 100, (retitled, unchanged, whole)

        # a new size moves every pane: the whole update after it is composed again, not kept
        before = len(drawn)
        await pilot.resize_terminal(130, 40)
        await wait_for(pilot, lambda: len(drawn) > before and ours.size.width == 130, "the resized draw")
        mine, textuals, _ = drawn[-1]
        assert mine == textuals
