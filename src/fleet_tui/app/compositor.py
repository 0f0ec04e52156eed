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

It also keeps the screen as last composed, each line's pieces by cut (the frame), up to date with
every update it draws. A widget tells Textual what it changed (else Textual's own partial updates
would not show it either), so the frame is the screen as Textual's whole draw would compose it.
A whole update is drawn from that frame, with only what changed since drawn anew: the regions the
compositor was given and the rows the widgets asked to repaint meanwhile (Textual drops those
from its own set when the whole screen is to be drawn). Textual's whole draw asks all thirteen
widgets of the cockpit for every row and cuts 255 rows into pieces: 1.1-1.3 ms of a dialog's
~3 ms close, where the bare app with one table draws in 0.2 ms. The draw that uncovers the screen
leaves the widgets' rows to the frame after (``defer_widgets``), as the cockpit leaves its live
lines: the close shows the screen as it was, at once, and what changed behind the dialog comes a
frame later. The frame is dropped when what it was made from moves: the widgets' places and
order, the cuts, the app's CSS (a theme); Textual's next whole draw makes it again. What reaches
the terminal is what Textual's own draws would write (``tests/app/test_compositor.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import pairwise
from typing import cast

from textual._compositor import ChopsUpdate, Compositor, LayoutUpdate
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

#: the piece of a line written cut to nothing
_NOTHING = Strip([], 0)
#: one line's spans of an update: (x1, x2) as Textual's ``_regions_to_spans`` gives them
Spans = dict[int, list[tuple[int, int]]]
#: what a frame was composed from: the widgets front to back with their region and clip, each
#: line's cuts, and the app's CSS version
Layout = tuple[dict[Widget, tuple[Region, Region]], list[list[int]], int]


class SpanCompositor(Compositor):
    """Textual's ``Compositor``, drawing an update from the rows its spans cross, and a whole
    screen from the frame it keeps."""

    def __init__(self, css_version: Callable[[], int] = lambda: 0) -> None:
        super().__init__()
        self._css_version = css_version
        #: the screen as last composed: each line's pieces by cut, every piece there
        self._frame: list[dict[int, Strip]] | None = None
        self._frame_layout: Layout | None = None
        #: a whole update drawn from the frame leaves the widgets' own repaints to a later
        #: update (its screen sets this for the draw that uncovers it) ...
        self.defer_widgets = False
        #: ... and those widgets are here after it, for the screen to draw next
        self.deferred: list[Widget] = []

    def clear(self) -> None:
        super().clear()
        self._frame = self._frame_layout = None

    def render_full_update(self, simplify: bool = False) -> LayoutUpdate:
        if simplify:  # an export's (SVG): the segments joined, the frame left as it is
            return super().render_full_update(simplify=True)
        screen = self.size.region
        frame = self._current_frame()
        if frame is None:
            self._dirty_regions.clear()
            chops = cast("list[dict[int, Strip]]", self._render_chops(screen, lambda y: True))
            self._frame, self._frame_layout = chops, self._layout()
            return LayoutUpdate([list(line.values()) for line in chops], screen)
        if self.defer_widgets:  # the screen draws them in the frame after (``deferred``)
            self.deferred = [w for w in self.visible_widgets if w._repaint_regions]
        else:  # the repaints Textual's whole draw leaves with the widgets, taken as it takes them
            self.update_widgets(set(self.visible_widgets))
        regions = {region for region in self._dirty_regions if region != screen}
        self._dirty_regions.clear()
        if regions:
            crop = Region.from_union(list(regions)).intersection(screen)
            by_line = _by_line(self._regions_to_spans(regions))
            self._keep(self._chops(crop, by_line), by_line)
        return LayoutUpdate([list(line.values()) for line in frame], screen)

    def render_partial_update(self) -> ChopsUpdate | None:
        regions = self._dirty_regions.copy()
        self._dirty_regions.clear()
        if not regions:
            return None
        crop = Region.from_union(regions).intersection(self.size.region)
        spans = list(self._regions_to_spans(regions))
        by_line = _by_line(spans)
        chops = self._chops(crop, by_line)
        self._keep(chops, by_line)
        return ChopsUpdate(chops, spans, [cut_set[1:] for cut_set in self.cuts])

    def _current_frame(self) -> list[dict[int, Strip]] | None:
        """The frame if what it was composed from is as it is now, else None (and it is
        dropped)."""
        if self._frame is None or self._frame_layout is None:
            return None
        widgets, cuts, css = self._frame_layout
        now_widgets, now_cuts = self.visible_widgets, self.cuts
        moved = (now_widgets is not widgets or now_cuts is not cuts) and (
            list(now_widgets.items()) != list(widgets.items()) or now_cuts != cuts
        )
        if moved or css != self._css_version():
            self._frame = self._frame_layout = None
            return None
        self._frame_layout = now_widgets, now_cuts, css  # the same, made again: met at once next
        return self._frame

    def _layout(self) -> Layout:
        return self.visible_widgets, self.cuts, self._css_version()

    def _keep(self, chops: Sequence[Mapping[int, Strip | None]], lines: Iterable[int]) -> None:
        """The pieces an update drew on ``lines``, into the frame (one drawn over another layout
        drops it)."""
        frame = self._current_frame()
        if frame is None:
            return
        for y in lines:
            kept = frame[y]
            for cut, piece in chops[y].items():
                if piece is not None and piece is not _NOTHING:
                    kept[cut] = piece

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


def _by_line(spans: Iterable[tuple[int, int, int]]) -> Spans:
    """``(y, x1, x2)`` spans by line."""
    by_line: Spans = {}
    for y, x1, x2 in spans:
        by_line.setdefault(y, []).append((x1, x2))
    return by_line


def _written(cut: int, end: int, spans: list[tuple[int, int]]) -> bool:
    """The piece of a line from ``cut`` to ``end`` is written with cells by one of ``spans``
    (``ChopsUpdate.render_segments`` writes a piece that meets a span; one that starts where the
    span ends, cut to nothing)."""
    return any(cut < x2 and end > x1 for x1, x2 in spans)
