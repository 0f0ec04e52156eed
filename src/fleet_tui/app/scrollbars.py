"""A scroll bar that is redrawn only when what it shows changed.

Why: a pane that follows a live log grows by a few lines every frame, and textual redraws its
scroll bar on every change of the bar's figures (the log's length, the window, the position):
under a loud agent that was the stream pane's bar, thirty-odd lines drawn through Rich and the
styles cache ten times a second, ~1.8 ms each on this 2-core machine (a sixth of the cockpit's
screen updates), for a thumb that moved by less than a cell, or (past ``MAX_LINES``, where the log
stops growing) not at all. ``SteadyScrollBar`` keeps the lines it drew last and answers with them
while its appearance is the same: its size, where its thumb starts and ends (in the eighths of a
cell textual draws), its colours, styles, filters, hover and grab. (Skipping the bar's repaints
would not do: textual also lays the bar out again, and so draws it, whenever its pane scrolls.)

While a pane grows (a live agent's log, below ``MAX_LINES``), the thumb does move every frame, and
the bar was drawn whole each time: 1.2 ms of a loud fleet's 5.4 ms frame (the median, 32 agents at
200 events/s), the longest wait a key met when it landed during a frame. A vertical bar's row is
one of a few (the track above the thumb, the thumb, the track below it, a thumb's end in eighths
of a cell), and textual draws each row from its own segment alone: the bar keeps every row by the
segment it comes from, and a moved thumb is put together from them. A row not kept yet (a thumb's
end in an eighth not seen in this look) is made as textual makes it, the segment in the bar's own
style through ``rows.py`` (tests compare every row with textual's own drawing), not by drawing the
whole bar through textual's styles cache: 0.6 ms unloaded, and 1-1.3 ms of a cursor move that
scrolled the queue under 32 agents at 200 events/s. The bar also keeps its last ``DRAWINGS``
drawings whole, by appearance: a pane that scrolls back and forth (the queue's cursor about its
last visible row) moves its thumb between a few places, each drawn as it was. Everything else
about it is textual's ``ScrollBar``.
"""

from __future__ import annotations

from math import ceil
from typing import Any

from rich.color import Color
from rich.segment import Segment
from textual.geometry import Region
from textual.scrollbar import ScrollBar, ScrollBarRender
from textual.strip import Strip
from textual.widget import Widget

from fleet_tui.app.rows import edges_of, row_of

#: the eighths of a cell textual's renderer draws a thumb's ends in
_STEPS = len(ScrollBarRender.VERTICAL_BARS)
#: whole drawings a bar keeps, the last used first to go (a few dozen strips each)
DRAWINGS = 16


def styled(widget: Widget) -> tuple[Any, ...]:
    """What any of ``widget``'s drawn rows depends on beyond its own figures: its styles (their
    cache key moves with every change), its background, the app's line filters and theme. For a
    widget that keeps rows it drew (``SteadyScrollBar``, the stream pane) to know when none will
    do."""
    return (
        widget.styles._cache_key,
        widget.background_colors,
        tuple(widget.get_line_filters()),
        widget.app.current_theme.name,
    )


class SteadyScrollBar(ScrollBar):
    """``ScrollBar``, drawing its lines again only when they would look different."""

    def __init__(self, vertical: bool = True, name: str | None = None, *, thickness: int = 1) -> None:
        super().__init__(vertical, name, thickness=thickness)
        #: its last ``DRAWINGS`` drawings by appearance, the most recently used last
        self._drawings: dict[tuple[Any, ...], list[Strip]] = {}
        self.reused = 0  # draws answered from one of them (for tests and benchmarks)
        #: the rows drawn for this look (all but the thumb's place), by the segment each came from
        self._rows: tuple[tuple[Any, ...], dict[Segment, Strip]] = ((), {})
        self.assembled = 0  # draws put together from its rows, not through textual (for tests and benchmarks)

    def appearance(self) -> tuple[Any, ...]:
        """What the bar's drawing depends on (``ScrollBar.render`` and ``render_bar``)."""
        parent = self.parent
        styles = parent.styles if isinstance(parent, Widget) else self.styles
        length = self.size.height if self.vertical else self.size.width
        virtual, window = self.window_virtual_size, self.window_size
        thumb: tuple[int, int] | None = None
        if window and length and virtual and length != virtual and virtual != window:
            thumb_size = max(1, window / (virtual / length))
            start = int((length - thumb_size) * (self.position / (virtual - window)) * _STEPS)
            thumb = (start, start + ceil(thumb_size * _STEPS))
        return (
            self.size,
            thumb,
            self.mouse_over,
            self.grabbed,
            styles.scrollbar_background,
            styles.scrollbar_color,
            styles.scrollbar_background_hover,
            styles.scrollbar_color_hover,
            styles.scrollbar_background_active,
            styles.scrollbar_color_active,
            parent.background_colors if isinstance(parent, Widget) else None,
            *styled(self),
        )

    def render_lines(self, crop: Region) -> list[Strip]:
        whole = self.size.region
        if crop == whole:
            return self._whole()
        if crop.column_span == whole.column_span and whole.contains_region(crop):  # some of its rows
            return self._whole()[crop.y : crop.bottom]
        return super().render_lines(crop)  # a part of its rows: as textual draws it

    def _whole(self) -> list[Strip]:
        """Every row of the bar: those drawn before when it looked the same."""
        crop = self.size.region
        key = self.appearance()
        drawings = self._drawings
        drawn = drawings.pop(key, None)
        if drawn is not None:
            self.reused += 1
            drawings[key] = drawn  # the most recently used now
            return list(drawn)
        strips = self._put_together(key[:1] + key[2:])  # (the look: all but the thumb's place)
        if strips is None:
            strips = super().render_lines(crop)
        drawings[key] = list(strips)
        if len(drawings) > DRAWINGS:
            del drawings[next(iter(drawings))]
        return strips

    def _put_together(self, look: tuple[Any, ...]) -> list[Strip] | None:
        """The bar from its rows: those kept for ``look``, the others made now; None where
        textual must draw it (``_row_segments``, ``_rows_of``)."""
        segments = self._row_segments()
        if segments is None:
            return None
        rows = self._rows[1] if self._rows[0] == look else {}
        made = self._rows_of([segment for segment in dict.fromkeys(segments) if segment not in rows])
        if made is None:
            return None
        if made:
            rows = {**rows, **made}
            self._rows = (look, rows)
        self.assembled += 1
        return [rows[segment] for segment in segments]

    def _rows_of(self, segments: list[Segment]) -> dict[Segment, Strip] | None:
        """The rows textual draws from ``segments`` (each a row of a bar one cell wide): the
        segment in the bar's own style, the row made as for any pane (``rows.py``); None where
        textual does more to a row (``edges_of``)."""
        if not segments:
            return {}
        edges = edges_of(self)
        if edges is None:
            return None
        base = self.rich_style
        return {
            segment: row_of(Strip([Segment(segment.text, base + segment.style)], 1), 1, 1, edges)
            for segment in segments
        }

    def _row_segments(self) -> list[Segment] | None:
        """The segment each row of a vertical bar one cell wide is drawn from, as ``render``'s
        renderable draws them (``ScrollBarRender.__rich_console__``); None for any other bar."""
        width, height = self.size
        renderable = self.render()
        if not self.vertical or width != 1 or not isinstance(renderable, ScrollBarRender):
            return None
        style = renderable.style
        if isinstance(style, str):  # a style by name: left to textual's own drawing
            return None
        bar = renderable.render_bar(
            size=height,
            window_size=renderable.window_size,
            virtual_size=renderable.virtual_size,
            position=renderable.position,
            vertical=True,
            thickness=width,
            back_color=style.bgcolor or Color.parse("#555555"),
            bar_color=style.color or Color.parse("bright_magenta"),
        )
        rows = list(bar.segments)  # one a row (``Segments`` adds the line breaks when rendered)
        return rows if len(rows) == height else None


def steady_scrollbar(widget: Widget, vertical: bool) -> ScrollBar:
    """``widget``'s vertical or horizontal scroll bar, made a ``SteadyScrollBar`` on first use.
    For a widget's ``vertical_scrollbar`` and ``horizontal_scrollbar`` properties (textual's make
    a ``ScrollBar`` the same way; a mixin class cannot carry them, as textual takes a widget's CSS
    from its first base class only)."""
    bar = widget._vertical_scrollbar if vertical else widget._horizontal_scrollbar
    if bar is not None:
        return bar
    if vertical:
        bar = widget._vertical_scrollbar = SteadyScrollBar(
            vertical=True, name="vertical", thickness=widget.scrollbar_size_vertical
        )
    else:
        bar = widget._horizontal_scrollbar = SteadyScrollBar(
            vertical=False, name="horizontal", thickness=widget.scrollbar_size_horizontal
        )
    bar.display = False
    widget.app._start_widget(widget, bar)
    return bar
