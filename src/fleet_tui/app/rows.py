"""A pane's row made from its content line and the edges Textual puts around it.

Textual draws a widget's row through its styles cache: border, padding, outline, tint, opacity,
hatching and line filters, each looked up again for every row drawn (``StylesCache.render_line``).
For a pane with none of them but a border, a row is its content line filled out to the content's
width, between the border's left and right cells, through the app's line filters. The stream
pane draws a loud agent's new lines every frame (55-75 us a row through the styles cache
unloaded, ~0.2 ms under a loud fleet); the queue draws its lines again whenever it scrolls, which
a cursor move can do (2.9 ms of one under 32 agents at 200 events/s). ``edges_of`` looks up what
goes around a row once for the pane's look, ``row_of`` puts a row together: the same row Textual
draws (tests compare them with Textual's own, with a border of different sides and a colour
filter), or None from ``edges_of`` where Textual does more to a row and must draw it itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.segment import Segment
from rich.style import Style
from textual._border import get_box
from textual.color import Color
from textual.filter import LineFilter
from textual.strip import Strip
from textual.style import Style as TextualStyle
from textual.widget import Widget


@dataclass(frozen=True)
class Edges:
    """What Textual puts around a content line to make a widget's row of it (a content row of
    ``StylesCache.render_line``): the border's left and right cells (none where there is no
    border), the background the line is filled out with, the app's line filters and the
    background they are given."""

    left: tuple[Segment, ...]
    right: tuple[Segment, ...]
    fill: Style
    filters: tuple[LineFilter, ...]
    background: Color


def edges_of(widget: Widget) -> Edges | None:
    """The edges of ``widget``'s content rows in its look now, or None where Textual does more to
    a row than put its line between them (padding, an outline, a tint, opacity, text opacity,
    hatching: none of them in the cockpit's styles)."""
    styles = widget.styles
    if (
        any(styles.padding)
        or any(edge for edge, _ in styles.outline)
        or styles.tint.a
        or styles.text_opacity != 1.0
        or (styles.has_rule("hatch") and styles.hatch != "none")
        or widget.opacity != 1.0
    ):
        return None
    base_background, background = widget.background_colors
    inner, outer = widget._styles_cache.get_inner_outer(base_background, background)
    _, (right, right_color), _, (left, left_color) = styles.border

    def cell(edge: str, color: Color, side: int) -> tuple[Segment, ...]:
        if not edge:
            return ()
        box = get_box(edge, inner, outer, TextualStyle(foreground=base_background + color))
        return (box[1][side],)

    return Edges(
        cell(left, left_color, 0),
        cell(right, right_color, 2),
        inner.rich_style,
        tuple(widget.get_line_filters()),
        background,
    )


def row_of(line: Strip, width: int, content_width: int, edges: Edges) -> Strip:
    """The row of content ``line`` in a widget ``width`` cells wide whose content is
    ``content_width`` wide, between ``edges``: as Textual's styles cache draws it."""
    line = line.adjust_cell_length(content_width, edges.fill)
    row = Strip([*edges.left, *line, *edges.right], width)
    for line_filter in edges.filters:
        row = row.apply_filter(line_filter, edges.background)
    return row
