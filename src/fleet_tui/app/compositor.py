"""The main screen's compositor: an update drawn from the rows it shows, not every row near it.

Textual draws a screen's update from the regions that changed. Its compositor asks every widget
whose clip overlaps the bounding box of those regions for all of its rows, then cuts every row of
every line the update touches at the edges of the widgets on that line, front to back, keeping the
first piece at each cut (the pieces behind it are hidden), and finally writes only the changed
spans. Under a loud fleet a live frame changes the stream pane's rows and a queue line or two: the
panes between them were drawn whole, the queue's rows beside the stream were cut into pieces on
every line the stream scrolled, and the panes' containers and the screen's background were cut
into pieces nobody sees (each a ``Strip`` with seven caches of its own). A traced run under 16
agents at 20 events/s spent most of its screen updates there.

``SpanCompositor`` asks each widget only for the rows an update's spans cross within its area, and
only those rows where a piece the update writes is not covered yet by a widget in front of it; a
row with nothing left to write is neither drawn nor cut. A whole update (a dialog closed, a resize)
is left to Textual's own ``_render_chops``: every line is written then, so there is nothing to skip
but the rows of containers behind their children, and Textual's plain loop over every row was
quicker than this one's bookkeeping (closing the help over 32 queued tasks: the screen's draw
2.5-2.6 against 2.9-3.0 ms, traced). What reaches the terminal is the same, byte for byte
(``tests/app/test_compositor.py`` compares it with Textual's compositor over many updates). Textual
is pinned in pyproject.toml: this follows ``Compositor._render_chops`` and
``render_partial_update`` of that version, and how ``ChopsUpdate.render_segments`` reads the chops
(a chop it writes is one whose cell range meets a span; an empty one it skips).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import cast

from textual._compositor import ChopsUpdate, Compositor
from textual.geometry import Region
from textual.strip import Strip

#: the piece of a line written cut to nothing
_NOTHING = Strip([], 0)
#: one line's spans of an update: (x1, x2) as Textual's ``_regions_to_spans`` gives them
Spans = dict[int, list[tuple[int, int]]]


class SpanCompositor(Compositor):
    """Textual's ``Compositor``, drawing an update from the rows its spans cross."""

    def render_partial_update(self) -> ChopsUpdate | None:
        regions = self._dirty_regions.copy()
        self._dirty_regions.clear()
        if not regions:
            return None
        crop = Region.from_union(regions).intersection(self.size.region)
        spans = list(self._regions_to_spans(regions))
        by_line: Spans = {}
        for y, x1, x2 in spans:
            by_line.setdefault(y, []).append((x1, x2))
        chops = self._chops(crop, by_line)
        return ChopsUpdate(chops, spans, [cut_set[1:] for cut_set in self.cuts])

    def _chops(self, crop: Region, spans: Spans) -> Sequence[Mapping[int, Strip]]:
        """Each screen line's pieces between its cuts, filled where ``spans`` write them: by the
        front-most widget there, as Textual's compositor does (its widgets are kept front to
        back); the pieces no span writes stay empty."""
        cuts = self.cuts
        chops: list[dict[int, Strip | None]] = [dict.fromkeys(cut_set[:-1]) for cut_set in cuts]
        for y, on_line in spans.items():
            # a piece that starts where a span ends is written cut to nothing (a cursor move and
            # no cells): any piece will do, and no widget is drawn for it
            for cut, end in pairwise(cuts[y]):
                if any(cut == x2 for _, x2 in on_line) and not _written(cut, end, on_line):
                    chops[y][cut] = _NOTHING
        for widget, (region, clip) in self.visible_widgets.items():
            if not crop.overlaps(clip):
                continue
            area = region.intersection(clip)
            if not area:
                continue
            left, right = area.column_span
            rows: list[tuple[int, list[int]]] = []  # (line, its cuts in the area) still to write
            for y in area.line_range:
                line_spans = spans.get(y)
                if line_spans is None:
                    continue
                line = chops[y]
                edges = [cut for cut in cuts[y] if left <= cut <= right]
                if any(
                    line.get(cut) is None and _written(cut, end, line_spans) for cut, end in pairwise(edges)
                ):
                    rows.append((y, edges))
            if not rows:
                continue
            first, last = rows[0][0], rows[-1][0]
            strips = widget.render_lines(
                Region(left - region.x, first - region.y, area.width, last - first + 1)
            )
            for y, edges in rows:
                if y - first >= len(strips):
                    break
                line = chops[y]
                pieces = strips[y - first].divide([cut - left for cut in edges[1:]])
                for cut, piece in zip(edges, pieces, strict=False):
                    if line.get(cut) is None:
                        line[cut] = piece
        return cast("Sequence[Mapping[int, Strip]]", chops)


def _written(cut: int, end: int, spans: list[tuple[int, int]]) -> bool:
    """The piece of a line from ``cut`` to ``end`` is written with cells by one of ``spans``
    (``ChopsUpdate.render_segments`` writes a piece that meets a span; one that starts where the
    span ends, cut to nothing)."""
    return any(cut < x2 and end > x1 for x1, x2 in spans)
