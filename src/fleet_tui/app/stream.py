"""The stream pane: the selected task's normalized events, live, coloured by kind.

Agents can emit hundreds of events a second; writing each one to the log would re-render the pane
as often. Events are appended to a buffer and ``flush`` writes whatever accumulated in one go, once
per frame of the app (with the queue's changed rows: one screen update for both). An event is one
line of known width, so it is rendered straight to one strip and appended (``RichLog.write`` would
measure, wrap, split and copy each line twice more, on the app's loop, for every frame and fill).
The log keeps a bounded number of lines (the full history is in ``fleet-tui logs`` and the detail
screen), and the events behind them: a line is cut to the pane's width when written, so when the
width changes (the terminal resized, or the first layout settling after the fill) every kept line is
rendered again at the new width rather than staying cut at the old one. Only the lines in view are
drawn when written (the end of the log, which the pane follows); the others are drawn when first
scrolled to: a fill of 200 events drew all 200, ~7 ms of the cockpit's thread (twice that while the
hosted engine competes for the interpreter) for the ~20 on screen. When the selection changes the pane is
cleared at once and filled from the engine's stored events only after the screen has been refreshed
(so a cursor move is on screen without waiting for the read and 200 lines drawn, and a key held down
reads only where the cursor rests), then follows live ones, dropping any the fill already showed (by
attempt and sequence number).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Self

from rich.style import Style
from rich.text import Text
from textual.cache import LRUCache
from textual.events import Resize
from textual.geometry import Region, Size
from textual.reactive import Reactive
from textual.scrollbar import ScrollBar
from textual.strip import Strip
from textual.widgets import RichLog

from fleet_tui.app.format import event_line, event_segments, inert
from fleet_tui.app.rows import Edges, edges_of, row_of
from fleet_tui.app.scrollbars import steady_scrollbar, styled
from fleet_tui.app.theme import ThemeStyles
from fleet_tui.scheduler.model import Event

MAX_LINES = 2000
FILL_LIMIT = 200  # a screenful or four; the detail screen and `fleet-tui logs` have the rest
#: lines kept cut to the pane's width by ``RichLog`` (its own keeps 1024): a few screenfuls
LINE_CACHE = 256

#: a kept line not drawn yet: ``StreamLog._render_line`` draws it from the event behind it
UNDRAWN = Strip([])
#: the key of the rows past the log's last line among a pane's kept rows (``StreamLog._rows``)
BLANK_ROW = -(1 << 31)


class _NoteLine(str):
    """One line of a wrapped note of the cockpit's own, remembering the whole note (and which
    note: the same text may be noted twice) so a resize wraps the note again from its words."""

    whole: str
    note: object

    def __new__(cls, line: str, whole: str, note: object) -> Self:
        made = super().__new__(cls, line)
        made.whole, made.note = whole, note
        return made


class StreamLog(RichLog):
    """Events of one task. Call ``follow`` on selection, ``offer`` for every live event."""

    virtual_size: Reactive[Size] = Reactive(Size(0, 0), layout=False)
    """As a widget's, but a longer log is no new layout: every line written used to reflow and
    repaint the whole screen; now only this pane and its scrollbar are redrawn."""

    @property
    def vertical_scrollbar(self) -> ScrollBar:
        """Redrawn only when it would look different (scrollbars.py)."""
        return steady_scrollbar(self, vertical=True)

    @property
    def horizontal_scrollbar(self) -> ScrollBar:
        return steady_scrollbar(self, vertical=False)

    def watch_virtual_size(self, size: Size) -> None:
        self._scroll_update(size)
        self.refresh()

    def __init__(self, *, id: str | None = None, max_lines: int = MAX_LINES) -> None:
        self._rows: dict[int, Strip] = {}  # a kept line's number -> its row as last drawn
        self._rows_look: tuple[object, ...] | None = None  # what those rows were drawn with
        self.rows_drawn = 0  # rows drawn, not kept (tests, benchmarks)
        self.rows_direct = 0  # of those, log lines' rows put together here (``rows.py``)
        self._edges: Edges | None = None  # for the look the kept rows were drawn with
        super().__init__(id=id, max_lines=max_lines, wrap=False, markup=False, highlight=False)
        self.task_id: str | None = None
        self._buffer: list[Event] = []
        self._filling = False
        self._last: tuple[int, int] = (-1, -1)
        self._styles: ThemeStyles | None = None
        self._shown: deque[Event | str] = deque(maxlen=max_lines)
        self._width = 0  # the width the kept lines were cut to
        self._hint: str | None = None
        self._pass_style: Style | None = None  # the widget's style, during one ``render_lines``
        self._drawn_from = 0  # lines before this one are UNDRAWN (``_append``), unless scrolled to
        self._line_cache = LRUCache(LINE_CACHE)
        self.flushes = 0

    @property
    def filling(self) -> bool:
        """True while the pane's first fill (the task's stored events) is being read."""
        return self._filling

    def on_mount(self) -> None:
        self._styles = ThemeStyles(self.app)

    def follow(self, task_id: str | None, loader: Callable[[], Awaitable[list[Event]]] | None) -> None:
        """Show ``task_id``: clear, fill from ``loader`` (the stored events), then go live."""
        if task_id == self.task_id:
            return
        self.task_id = task_id
        self._hint = None
        self._buffer.clear()
        self._last = (-1, -1)
        self._shown.clear()
        self.clear()
        if task_id is None or loader is None:
            self._filling = False
            return
        self._filling = True
        # the cleared pane (and whatever moved the selection: the queue's cursor) reaches the
        # screen first; the stored events are read and drawn in a frame of their own after it
        self.call_after_refresh(self._start_fill, task_id, loader)

    def _start_fill(self, task_id: str, loader: Callable[[], Awaitable[list[Event]]]) -> None:
        if task_id != self.task_id:  # the selection moved on before the screen was refreshed
            return

        async def fill() -> None:  # a callable, so a cancelled fill leaves no un-awaited coroutine
            await self._fill(task_id, loader)

        self.run_worker(fill, exclusive=True, group="stream-fill")  # type: ignore[arg-type]

    async def _fill(self, task_id: str, loader: Callable[[], Awaitable[list[Event]]]) -> None:
        try:
            stored = await loader()
        except Exception as exc:  # the engine refused: show why, keep following live
            stored = []
            self._note(inert(f"(could not load stored events: {exc})"))
        if task_id != self.task_id:
            return
        live = self._buffer
        self._buffer = []
        self._filling = False
        self._write_events(stored)
        self._write_events(live)

    def offer(self, events: Iterable[Event]) -> None:
        """Queue live events; those of other tasks are ignored."""
        if self.task_id is None:
            return
        self._buffer.extend(ev for ev in events if ev.task_id == self.task_id)

    @property
    def pending(self) -> bool:
        """Events wait for ``flush``."""
        return bool(self._buffer)

    def flush(self) -> None:
        if self._filling or not self._buffer:
            return
        pending, self._buffer = self._buffer, []
        self._write_events(pending)

    def show_hint(self, text: str) -> None:
        """While no task is followed: a line saying why (written again only when it changes)."""
        if self.task_id is not None or text == self._hint:
            return
        self._hint = text
        self._shown.clear()
        self.clear()
        self._note(text)

    def _note(self, text: str) -> None:
        """A line of the cockpit's own (kept like the events, so a resize renders it again),
        wrapped at the pane's width once it is known (``_rerender`` wraps it again)."""
        if not self._size_known:
            self._shown.append(text)
            return
        width = self._line_width()
        if self._shown and width != self._width:  # what is kept was cut at another width
            self._rerender()
        self._width = width
        lines = self._wrapped([text], width)
        self._shown.extend(lines)
        self._append(lines, width)

    def _line_width(self) -> int:
        return max(self.scrollable_content_region.width or 120, 20)

    def _line(self, item: Event | str, width: int) -> Text:
        return event_line(item, width, self._styles) if isinstance(item, Event) else Text(item)

    def _write_events(self, events: Iterable[Event]) -> None:
        width = self._line_width()
        if self._size_known and self._shown and width != self._width:  # cut at another width
            self._rerender()
        self._width = width
        fresh: list[Event] = []
        for ev in events:
            key = (ev.attempt, ev.seq)
            if key <= self._last:
                continue
            self._last = key
            fresh.append(ev)
        if not fresh:
            return
        self._shown.extend(fresh)
        if self._size_known:  # else they are rendered when the pane first learns its size (``on_resize``)
            self._append(fresh[-self.max_lines :] if self.max_lines else fresh, width)
        self.flushes += 1

    def on_resize(self, event: Resize) -> None:
        # runs before RichLog's own handler (textual calls each class's, subclass first), which
        # then marks the size known; nothing is left deferred for it to write
        if event.size.width and self._shown and (not self._size_known or self._line_width() != self._width):
            self._rerender()

    def _rerender(self) -> None:
        """Every kept line again, cut to the pane's width now (the scroll stays where it was
        unless it followed the end)."""
        width = self._width = self._line_width()
        self.clear()
        if any(isinstance(item, str) for item in self._shown):
            self._shown = deque(self._wrapped(list(self._shown), width), maxlen=self._shown.maxlen)
        if self._shown:
            self._append(list(self._shown), width)

    @property
    def rich_style(self) -> Style:
        """The widget's style: during a redraw, the one read when it began. ``RichLog`` asks for
        it twice on every line it draws, and each ask walks the styles of every ancestor (a third
        of a scrolling pane's redraw); it cannot change within one pass."""
        return self._pass_style if self._pass_style is not None else super().rich_style

    def render_lines(self, crop: Region) -> list[Strip]:
        """The rows in ``crop``, with the widget's style read once for them (``rich_style``).
        Textual's own compositor asked every widget in a pane's row of the screen for its rows
        whenever anything there was drawn, and a key's draw of the queue beside this pane drew
        the live lines waiting for the next frame only for them to be cut away; the main
        screen's compositor (``compositor.py``) asks only for the rows it writes."""
        self._pass_style = self.rich_style
        try:
            return self._rows_for(crop)
        finally:
            self._pass_style = None

    def clear(self) -> Self:
        # the kept lines are numbered from 0 again; the border's rows and the blank row stay
        self._rows = {n: row for n, row in self._rows.items() if n < 0}
        self._drawn_from = 0
        return super().clear()

    def _rows_for(self, crop: Region) -> list[Strip]:
        """The pane's rows in ``crop``: each log line's row and the border's as drawn the last time
        they were in view (a scroll moves the rows, it does not change them: following a live
        agent, only the new lines at the end are drawn, not every line in view again); a line
        not drawn yet put between the edges of its row (``rows.edges_of``: textual's own cells,
        looked up once a look), the border's rows through textual, and the rows past the last
        line as one of them drawn once (a cleared pane, when the selection moves, was 30 blank
        rows drawn through textual within the key's own draw: 4-5 ms of a cursor move under a
        loud fleet). Anything else that changes how a row looks (size, styles, focus, title,
        theme, filters) draws them all again."""
        width, height = size = self.region.size  # with the border, as textual draws it
        top, _, bottom, _ = self.styles.gutter
        if crop.column_span != (0, width):
            return super().render_lines(crop)
        look = (
            size,
            self.scroll_offset.x,
            self._pass_style,
            self.has_focus,
            self.border_title,
            self.border_subtitle,
            *styled(self),
        )
        if look != self._rows_look:  # drawn otherwise now: none of the kept rows will do
            self._rows.clear()
            self._rows_look = look
            self._edges = edges_of(self)
        first = self.scroll_offset.y - top + self._start_line  # the line on row 0, numbered for good
        end = self._start_line + len(self.lines)

        def line_of(y: int) -> int:
            """Row ``y``'s key among the kept rows: its line's number, a border row's -1 - y, a
            row past the last line ``BLANK_ROW`` (every one of them looks the same)."""
            if not top <= y < height - bottom:
                return -1 - y
            n = first + y
            return n if n < end else BLANK_ROW

        keys = [line_of(y) for y in crop.line_range]
        if BLANK_ROW in keys and BLANK_ROW not in self._rows:  # one drawn, the others the same
            y = crop.y + keys.index(BLANK_ROW)
            self.rows_drawn += 1
            self._rows[BLANK_ROW] = super().render_lines(Region(0, y, width, 1))[0]
        rows: list[Strip | None] = [self._rows.get(n) for n in keys]
        if (edges := self._edges) is not None:  # a log line's row: its line between the edges
            content_width, content_height = self.content_region.size
            for i, n in enumerate(keys):
                if rows[i] is None and n >= 0 and (y := crop.y + i - top) < content_height:
                    self.rows_drawn += 1
                    self.rows_direct += 1
                    rows[i] = self._rows[n] = row_of(self.render_line(y), width, content_width, edges)
        i = 0
        while i < len(rows):  # the rows not kept, a run at a time
            if rows[i] is not None:
                i += 1
                continue
            j = i
            while j < len(rows) and rows[j] is None:
                j += 1
            self.rows_drawn += j - i
            for y, strip in enumerate(super().render_lines(Region(0, crop.y + i, width, j - i)), crop.y + i):
                rows[y - crop.y] = self._rows[line_of(y)] = strip
            i = j
        if len(self._rows) > 2 * height:  # keep what is in view
            self._rows = {n: r for n, r in self._rows.items() if n < 0 or first <= n < first + height}
        return [r for r in rows if r is not None]  # (every row is drawn by now)

    def _item_strip(self, item: Event | str, width: int) -> Strip:
        """A kept item's line cut to ``width``, as the strip ``write`` makes of it."""
        if isinstance(item, Event) and (segments := event_segments(item, width, self._styles)) is not None:
            return Strip(segments, sum(segment.cell_length for segment in segments))
        return self._strip(self._line(item, width))

    def _strip(self, line: Text) -> Strip:
        """One event line (no newline: ``event_line`` folds them) as the strip ``write`` makes."""
        if "\t" in line.plain:
            line.expand_tabs(self.app.console.tab_size)
        return Strip(line.render(self.app.console), line.cell_len)

    def _render_line(self, y: int, scroll_x: int, width: int) -> Strip:
        if y < len(self.lines) and self.lines[y] is UNDRAWN:  # scrolled to: drawn now, once
            # ``_shown`` keeps the items behind the kept lines, in the same order, to the same cap
            self.lines[y] = self._item_strip(self._shown[y - len(self.lines)], self._width)
            self._drawn_from = min(self._drawn_from, y)
        return super()._render_line(y, scroll_x, width)

    def _wrapped(self, items: Sequence[Event | str], width: int) -> list[Event | str]:
        """The cockpit's own lines (a hint, an error) wrapped at ``width`` cells, one item a line
        (``_render_line`` maps lines to ``_shown`` one to one): an event line is cut at the pane's
        edge (the detail screen shows it whole), but a sentence cut there says nothing ("press f
        to show the")."""
        out: list[Event | str] = []
        last: _NoteLine | None = None
        for item in items:
            if not isinstance(item, str):
                out.append(item)
                last = None
                continue
            if isinstance(item, _NoteLine):
                if last is not None and item.note is last.note:
                    continue  # a later line of a note wrapped again whole
                whole, note = item.whole, item.note
            else:
                whole, note = item, object()
            lines = [line.plain for line in Text(whole).wrap(self.app.console, width)] or [whole]
            wrapped = [_NoteLine(line, whole, note) for line in lines]
            out.extend(wrapped)
            last = wrapped[0]
        return out

    def _append(self, items: Sequence[Event | str], width: int) -> None:
        """``RichLog.write``'s bookkeeping for lines cut to ``width``: the lines kept (the oldest
        dropped past ``max_lines``), the widest line, the virtual size, the scroll to the end
        (textual is pinned in pyproject.toml: this follows its ``RichLog.write``). The last
        screenful is drawn now, the lines above it when first shown (``UNDRAWN``): each is at
        most ``width`` cells, which is what the widest is taken to be then."""
        drawn = max(self.size.height, 1)
        undrawn = max(len(items) - drawn, 0)
        strips = [UNDRAWN] * undrawn + [self._item_strip(item, width) for item in items[undrawn:]]
        self.lines.extend(strips)
        if self.max_lines is not None and len(self.lines) > self.max_lines:
            cut = len(self.lines) - self.max_lines
            self._start_line += cut
            self._drawn_from = max(self._drawn_from - cut, 0)
            self.refresh()
            self.lines = self.lines[-self.max_lines :]
        # what scrolled a screenful past the view is drawn again if scrolled back to
        if (end := len(self.lines) - 2 * drawn) > self._drawn_from:
            self.lines[self._drawn_from : end] = [UNDRAWN] * (end - self._drawn_from)
            self._drawn_from = end
        widest = width if undrawn else max(s.cell_length for s in strips)
        self._widest_line_width = max(self._widest_line_width, widest)
        self.virtual_size = Size(self._widest_line_width, len(self.lines))
        if self.auto_scroll:
            # now, not after the next refresh as ``RichLog.write`` does: the size is known here,
            # and a deferred scroll drew the pane (and its bar) once more, in between, at the old
            # position with the new length
            self.scroll_end(animate=False, immediate=True, x_axis=False)
