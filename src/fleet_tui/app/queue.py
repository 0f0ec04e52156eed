"""The queue pane: a virtualized list of tasks, drawn one screen line at a time.

A backlog can hold ten thousand tasks while a screen shows forty. ``QueueView`` is a line-API
widget: it draws only the rows on screen, so its cost follows the screen, not the queue. The order,
the repository groups and the folded finished tasks come from ``order.QueueModel``; a task change
that does not move the task repaints its one line (when on screen), and one that moves it rebuilds
the list of row references once, keeping the cursor on its task and the view where it was.

Columns take the width there is: names first (a name is never cut while a column can still give
way), then the state, and low-value columns are dropped on narrow terminals instead of being cut
to one letter. Every cell that came from an agent, a task file or git is sanitized: text on
screen, never a terminal escape.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import ClassVar

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.scrollbar import ScrollBar
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Input

from fleet_tui.app.columns import Column, cell_texts, cut_end, cut_middle, group_text, layout
from fleet_tui.app.format import GLYPHS, TaskFilter, duration, elapsed
from fleet_tui.app.order import FINISHED, QueueModel, Row
from fleet_tui.app.rows import Edges, edges_of, row_of
from fleet_tui.app.scrollbars import steady_scrollbar, styled
from fleet_tui.scheduler.model import Task
from fleet_tui.scheduler.states import ACTIVE

#: rows put together from lines a queue keeps, per row of its content, before it keeps only those
#: of the lines it drew last (the others' tasks moved, changed or left)
ROWS_KEPT = 4


def focus_now(widget: Widget) -> None:
    """Move focus before the next queued key is handled.

    ``Widget.focus()`` defers the change, so keys typed fast (or pasted) right after ``/`` or ``a``
    would still reach the cockpit's bindings: ``/state:run`` would open a shell on ``s``.
    """
    try:
        widget.screen.set_focus(widget)
    except Exception:
        widget.focus()


class QueueView(ScrollView, can_focus=True):
    """The task queue: rows are task ids, group headers and folded counts."""

    COMPONENT_CLASSES = {
        "queue--header",
        "queue--cursor",
        "queue--group",
        "queue--folded",
        "queue--attention",
        "queue--finished",
    }
    DEFAULT_CSS = """
    QueueView {
        background: $background;
        scrollbar-size-vertical: 1;
        overflow-x: hidden;
        & > .queue--header { color: $text-muted; text-style: bold; }
        & > .queue--cursor { background: $block-cursor-blurred-background; }
        &:focus > .queue--cursor {
            background: $block-cursor-background;
            color: $block-cursor-foreground;
            text-style: $block-cursor-text-style;
        }
        & > .queue--group { color: $text-primary; text-style: bold; }
        & > .queue--folded { color: $text-muted; text-style: italic; }
        & > .queue--attention { color: $text-warning; text-style: bold; }
        & > .queue--finished { color: $text-muted; }
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select", "detail", key_display="⏎", show=False),
        Binding("up", "cursor(-1)", "up", show=False),
        Binding("down", "cursor(1)", "down", show=False),
        Binding("pageup", "page(-1)", "page up", show=False),
        Binding("pagedown", "page(1)", "page down", show=False),
        Binding("home", "edge(0)", "first", show=False),
        Binding("end", "edge(1)", "last", show=False),
        Binding("space", "toggle_group", "fold group", show=False),
        Binding("left", "fold(1)", "fold group", show=False),
        Binding("right", "fold(0)", "unfold group", show=False),
    ]

    class Highlighted(Message):
        """The cursor moved to another task (``task_id`` None: a header or a folded count)."""

        def __init__(self, task_id: str | None) -> None:
            self.task_id = task_id
            super().__init__()

    class Selected(Message):
        """Enter (or a click on the cursor row) on a task."""

        def __init__(self, task_id: str) -> None:
            self.task_id = task_id
            super().__init__()

    @property
    def vertical_scrollbar(self) -> ScrollBar:
        """Redrawn only when it would look different (scrollbars.py): a cursor move that
        scrolls the list drew the whole bar again, a millisecond of the key's draw under load."""
        return steady_scrollbar(self, vertical=True)

    @property
    def horizontal_scrollbar(self) -> ScrollBar:
        return steady_scrollbar(self, vertical=False)

    def __init__(self, *, clock: Callable[[], float] = time.time, id: str | None = None) -> None:
        super().__init__(id=id)
        self.model = QueueModel()
        self.clock = clock
        self.cursor = 0
        self._cursor_row: Row | None = None
        self._rows: list[Row] = []
        self._rebuild_pending = False
        self._columns: tuple[Column, ...] = ()
        self._layout_for: tuple[int, int] = (-1, -1)
        self._style_cache: dict[tuple[str, bool, str], Style] = {}
        self._repaint: set[str] = set()
        #: a task's line as last drawn, by task id: the task (compared by identity), the rest of
        #: what the line shows (``render_line``), the line
        self._kept: dict[str, tuple[Task, tuple[object, ...], Strip]] = {}
        self._pass_width: int | None = None  # the content's width, during one ``render_lines``
        self._kept_will_do = False  # the next draw shows lines as last drawn (``kept_lines_will_do``)
        self._header: tuple[tuple[object, ...], Strip] | None = None  # (what it shows, the line)
        #: rows put together from their lines (``rows.py``): by the line's ``id``, (the line, the
        #: row), while the widget looks as it did then (``_row_look``, with what goes around a
        #: row); a row does not depend on where it is, so a scroll finds its rows here too. The
        #: line is held, so its ``id`` is not another's while it is here
        self._made: dict[int, tuple[Strip, Strip]] = {}
        self._row_look: tuple[object, ...] | None = None
        self._edges: Edges | None = None
        #: lines drawn since mount (a test and the benchmark read it: cost follows the screen)
        self.lines_drawn = 0

    # ------------------------------------------------------------------ feeding

    def apply(
        self, tasks: Iterable[Task], gone: Iterable[str] = (), asking: frozenset[str] | None = None
    ) -> None:
        """The one way rows change: new or changed tasks, tasks gone, the set of tasks asking a
        question (None: unchanged). A task object already held is skipped by identity; a change
        that does not move its task repaints its one line (when on screen), one that moves it
        rebuilds the row list once, on the next idle moment."""
        model = self.model
        if not model.tasks:  # the first paint: one sort instead of ten thousand inserts
            model.asking = asking if asking is not None else model.asking
            model.replace_all(tasks)
            self._after_change(True, [])
            return
        moved = bool(model.set_asking(asking)) if asking is not None and asking != model.asking else False
        changed: list[str] = []
        for task in tasks:
            if model.tasks.get(task.id) is task:
                continue
            if model.upsert(task):
                moved = True
            else:
                changed.append(task.id)
        for tid in gone:
            if tid in model.tasks:
                model.remove(tid)
                moved = True
        self._after_change(moved, changed)

    def set_filter(self, flt: TaskFilter) -> None:
        """A new filter (a user action): the rows are rebuilt at once, keeping the cursor's task."""
        self.model.set_filter(flt, flt.repos)
        self._rebuild()

    def set_order(self, order: str) -> None:
        self.model.set_order(order)
        self._rebuild()

    def set_show_finished(self, show: bool) -> None:
        self.model.set_show_finished(show)
        self._rebuild()

    def _after_change(self, moved: bool, changed: list[str]) -> None:
        if moved:
            self._schedule_rebuild()
        if changed:
            # cells that changed in place (tokens, cost, a waiting reason) wait for the next
            # frame (``repaint_changed``): agents publish usage far more often than a person reads
            self._repaint.update(changed)

    @property
    def repaint_pending(self) -> bool:
        """Rows whose cells changed in place wait for ``repaint_changed``."""
        return bool(self._repaint)

    def repaint_changed(self) -> None:
        """Repaint the on-screen lines whose cells changed in place (the app calls this once per
        frame, with the stream's flush: one screen update for both)."""
        ids, self._repaint = self._repaint, set()
        for tid in ids:
            self._refresh_task(tid)

    def _refresh_task(self, task_id: str) -> None:
        # (a change that alters its group's counts is a move: the rows are rebuilt and repainted)
        i = self.model.index(Row("task", task_id)) if not self.model.dirty else None
        if i is not None and self._on_screen(i):
            self.refresh_line(i + 1)

    def kept_lines_will_do(self) -> None:
        """The next draw is of a screen uncovered (a dialog closed): a task's line is shown as it
        was last drawn where only the task or its elapsed time changed since, and drawn again
        at the next ``repaint_changed`` (the frame after). While a dialog covered the queue,
        a loud fleet changed nearly every running task's line, and the close drew each of them
        anew: 1.7-3.2 ms of an ``esc`` close's 6-7 ms under 32 agents at 200 events/s."""
        self._kept_will_do = True

    def tick(self) -> None:
        """Once a second: repaint only the on-screen lines whose elapsed time runs."""
        self._ensure()
        first, last = self._visible_range()
        for i in range(first, last):
            row = self._rows[i]
            if row.kind == "task":
                task = self.model.tasks.get(row.ref)
                if task is not None and task.status in ACTIVE:
                    self.refresh_line(i + 1)

    # ------------------------------------------------------------------ rows and cursor

    def _schedule_rebuild(self) -> None:
        if not self._rebuild_pending:
            self._rebuild_pending = True
            self.call_later(self._rebuild)

    def _ensure(self) -> None:
        if self.model.dirty or self._rebuild_pending:
            self._rebuild()

    def _rebuild(self) -> None:
        """New row list from the model; the cursor stays on its row (its task), the view holds."""
        self._rebuild_pending = False
        before = self._cursor_row
        rows = self.model.rows()
        self._rows = rows
        index = self.model.index(before) if before is not None else None
        if before is None:  # the first rows: start on the first task, not on a group header
            index = next((i for i, r in enumerate(rows[:50]) if r.is_task), 0)
        elif index is None:
            index = self._fallback_index(before)
        self._set_virtual_size()
        self._move(index, post=before != (rows[index] if rows else None))
        self.refresh()

    def _fallback_index(self, lost: Row | None) -> int:
        """Where the cursor goes when its row vanished: its task's group header (folded), the
        folded count (a finished task hidden), else the same position."""
        if lost is not None and lost.kind == "task":
            task = self.model.tasks.get(lost.ref)
            root = self.model.group_of(lost.ref)
            if task is not None and root is not None:
                for row in (Row("folded", root), Row("group", root)):
                    if task.status not in FINISHED and row.kind == "folded":
                        continue
                    i = self.model.index(row)
                    if i is not None:
                        return i
        index = min(self.cursor, max(len(self._rows) - 1, 0))
        # the same position, on a task if one follows closely (not on a group header)
        near = next((i for i in range(index, min(index + 3, len(self._rows))) if self._rows[i].is_task), None)
        return index if near is None else near

    def _set_virtual_size(self) -> None:
        width = self.scrollable_content_region.width or self.size.width
        self.virtual_size = Size(width, len(self._rows) + 1)

    def _move(self, index: int, post: bool = True) -> None:
        rows = self._rows
        if not rows:
            self.cursor = 0
            changed = self._cursor_row is not None
            self._cursor_row = None
            if changed and post:
                self.post_message(self.Highlighted(None))
            return
        index = max(0, min(index, len(rows) - 1))
        old_index, old_row = self.cursor, self._cursor_row
        self.cursor = index
        self._cursor_row = rows[index]
        self._scroll_to_cursor()
        if old_index != index:
            self.refresh_line(old_index + 1)
            self.refresh_line(index + 1)
        if post and rows[index] != old_row:
            self.post_message(self.Highlighted(rows[index].ref if rows[index].is_task else None))

    def _page_height(self) -> int:
        return max(1, self.scrollable_content_region.height - 1)

    def _scroll_to_cursor(self) -> None:
        height = self._page_height()
        top = round(self.scroll_y)
        if self.cursor < top:
            top = self.cursor
        elif self.cursor >= top + height:
            top = self.cursor - height + 1
        if top != round(self.scroll_y):
            self.scroll_to(y=top, animate=False, immediate=True)

    def _visible_range(self) -> tuple[int, int]:
        top = round(self.scroll_y)
        return top, min(len(self._rows), top + self._page_height())

    def _on_screen(self, index: int) -> bool:
        first, last = self._visible_range()
        return first <= index < last

    # ------------------------------------------------------------------ the public reading API

    @property
    def rows(self) -> list[Row]:
        self._ensure()
        return self._rows

    def task_ids(self) -> list[str]:
        """The task ids on display, top to bottom (headers and folded counts left out)."""
        return [r.ref for r in self.rows if r.kind == "task"]

    @property
    def row_count(self) -> int:
        """Task rows on display."""
        self._ensure()
        return self.model.task_count()

    @property
    def cursor_row(self) -> int:
        self._ensure()
        return self.cursor

    @property
    def cursor_ref(self) -> Row | None:
        self._ensure()
        return self._cursor_row

    @property
    def selected_id(self) -> str | None:
        self._ensure()
        row = self._cursor_row
        return row.ref if row is not None and row.is_task else None

    def select_id(self, task_id: str, reveal: bool = True) -> bool:
        """Put the cursor on a task (unfolding its group or the finished tasks when needed)."""
        if task_id not in self.model.tasks:
            return False
        self._ensure()
        if reveal and self.model.index(Row("task", task_id)) is None:
            self.model.reveal(task_id)
            self._rebuild()
        i = self.model.index(Row("task", task_id))
        if i is None:
            return False
        self._move(i)
        return True

    def select_row(self, row: Row) -> bool:
        """Put the cursor back on a row (a task, a group header, a folded count) if it is there."""
        if row.is_task:
            return self.select_id(row.ref)
        self._ensure()
        i = self.model.index(row)
        if i is not None:
            self._move(i)
        return i is not None

    def get_cell(self, task_id: str, key: str) -> str:
        """The text a task's cell shows (before fitting to its column)."""
        task = self.model.tasks[task_id]
        return cell_texts(task, self.clock(), self.model.is_asking(task))[key]

    def go_top(self) -> None:
        self._ensure()
        self._move(0)

    def go_bottom(self) -> None:
        self._ensure()
        self._move(len(self._rows) - 1)

    def next_attention(self) -> bool:
        """The next task (after the cursor, wrapping) that needs the person; False if none."""
        self._ensure()
        model = self.model
        wanted = [
            t.id for t in model.tasks.values() if t.status not in FINISHED and (band_is_attention(t, model))
        ]
        if not wanted:
            return False
        wanted_set = set(wanted)
        n = len(self._rows)
        for step in range(1, n + 1):
            row = self._rows[(self.cursor + step) % n]
            if row.kind == "task" and row.ref in wanted_set:
                self._move((self.cursor + step) % n)
                return True
        # all of them hidden (filtered out, or in a folded group): reveal the first
        for tid in wanted:
            if model.matches(model.tasks[tid]):
                return self.select_id(tid)
        return False

    # ------------------------------------------------------------------ actions

    def action_cursor(self, step: int) -> None:
        self._ensure()
        self._move(self.cursor + step)

    def action_page(self, direction: int) -> None:
        self._ensure()
        page = self._page_height()
        self.scroll_to(y=round(self.scroll_y) + direction * page, animate=False, immediate=True)
        self._move(self.cursor + direction * page)

    def action_edge(self, end: int) -> None:
        self.go_bottom() if end else self.go_top()

    def action_select(self) -> None:
        row = self.cursor_ref
        if row is None:
            return
        if row.is_task:
            self.post_message(self.Selected(row.ref))
        elif row.kind == "group":
            self.action_toggle_group()
        else:
            self.set_show_finished(True)

    def action_toggle_group(self) -> None:
        row = self.cursor_ref
        if row is None:
            return
        root = row.ref if row.kind != "task" else self.model.group_of(row.ref)
        if root is None or not self.model.grouped:
            return
        self._cursor_row = Row("group", root)
        self.model.toggle_group(root)
        self._rebuild()

    def action_fold(self, fold: int) -> None:
        row = self.cursor_ref
        if row is None or not self.model.grouped:
            return
        root = row.ref if row.kind != "task" else self.model.group_of(row.ref)
        if root is None:
            return
        if bool(fold) == (root in self.model.collapsed):
            return
        self._cursor_row = Row("group", root)
        self.model.toggle_group(root, bool(fold))
        self._rebuild()

    async def _on_click(self, event: events.Click) -> None:
        self._ensure()
        index = round(self.scroll_y) + event.y - 1
        if event.y < 1 or not 0 <= index < len(self._rows):
            return
        if index == self.cursor:
            self.action_select()
        else:
            self._move(index)

    # ------------------------------------------------------------------ drawing

    def on_resize(self, event: events.Resize) -> None:
        self._set_virtual_size()
        self._scroll_to_cursor()

    def on_mount(self) -> None:
        self._set_virtual_size()

    def columns(self) -> tuple[Column, ...]:
        width = self._content_width()
        key = (width, self.model.max_name)
        if key != self._layout_for:
            self._layout_for = key
            self._columns = layout(width, self.model.max_name)
        return self._columns

    def notify_style_update(self) -> None:
        self._style_cache.clear()
        super().notify_style_update()

    def _style(self, name: str) -> Style:
        """A component's style, looked up once per theme and focus state (not once per line)."""
        key = (name, self.has_focus, self.app.theme)
        style = self._style_cache.get(key)
        if style is None:
            style = self.rich_style if name == "base" else self.get_component_rich_style(name)
            self._style_cache[key] = style
        return style

    def render_lines(self, crop: Region) -> list[Strip]:
        """As textual's, with the content's width read once for the lines of one pass (each read
        walks the widget's scroll bars and gutter: a quarter of a line's drawing), and each row
        put together from its line (``rows.py``; kept with the line, wherever the line is drawn):
        a scroll draws every row again, through textual's styles cache 2.9 ms of a cursor move
        under 32 agents at 200 events/s, put together again 0.4-2 ms."""
        self._pass_width = self.scrollable_content_region.width
        try:
            return self._rows_for(crop)
        finally:
            self._pass_width = None
            self._kept_will_do = False

    def _rows_for(self, crop: Region) -> list[Strip]:
        width = self.region.width
        look = (self.region.size, *styled(self))
        if look != self._row_look:  # drawn otherwise now: none of the rows made will do
            self._row_look, self._edges, self._made = look, edges_of(self), {}
        content_width, content_height = self.content_region.size
        edges = self._edges
        if (
            edges is None
            or self.styles.gutter.top
            or crop.column_span != (0, width)
            or crop.bottom > content_height
        ):
            return super().render_lines(crop)
        kept = self._made
        drawn: list[tuple[Strip, Strip]] = []
        for y in crop.line_range:
            line = self.render_line(y)
            made = kept.get(id(line))
            if made is None:
                made = kept[id(line)] = (line, row_of(line, width, content_width, edges))
            drawn.append(made)
        if len(kept) > ROWS_KEPT * content_height:  # most of them of lines gone: these stay
            self._made = {id(line): (line, row) for line, row in drawn}
        return [row for _, row in drawn]

    def _content_width(self) -> int:
        width = self._pass_width
        return self.scrollable_content_region.width if width is None else width

    def render_line(self, y: int) -> Strip:
        self.lines_drawn += 1
        width = self._content_width()
        base = self._style("base")
        if y == 0:
            columns = self.columns()
            style = base + self._style("queue--header")
            if self._header is None or self._header[0] != (columns, style, width):
                line = self._line([(c.label, c) for c in columns], style, width)
                self._header = ((columns, style, width), line)
            return self._header[1]
        index = round(self.scroll_y) + y - 1
        if index >= len(self._rows):
            return Strip.blank(width, base)
        row = self._rows[index]
        style = base
        if row.kind == "task":
            task = self.model.tasks.get(row.ref)
            if task is None:
                return Strip.blank(width, base)
            asking = self.model.is_asking(task)
            now = self.clock()
            if asking or task.status.value == "needs_human":
                style += self._style("queue--attention")
            elif task.status in FINISHED:
                style += self._style("queue--finished")
            strip_style = style
            if index == self.cursor:
                strip_style = style + self._style("queue--cursor")
            columns = self.columns()
            # a line is drawn again only when what it shows changed: a scroll or a rebuilt
            # list moves lines, and a loud fleet changes a few of them a frame, not all
            shows = (asking, duration(elapsed(task, now)), strip_style, width, columns)
            kept = self._kept.get(task.id)
            if kept is not None and kept[1][2:] == shows[2:]:  # the same look, width and columns
                if kept[0] is task and kept[1] == shows:
                    return kept[2]
                if self._kept_will_do:
                    self._repaint.add(task.id)  # drawn as it is now at the next frame
                    return kept[2]
            values = cell_texts(task, now, asking)
            line = self._line([(values[c.key], c) for c in columns], strip_style, width)
            if len(self._kept) > 2 * len(self._rows) + 64:  # tasks long gone from the list
                self._kept.clear()
            self._kept[task.id] = (task, shows, line)
            return line
        if row.kind == "group":
            info = self.model.group(row.ref)
            text = group_text(info) if info is not None else row.ref
            style += self._style("queue--group")
        else:
            info = self.model.group(row.ref)
            n = info.finished if info is not None else 0
            text = f"  {GLYPHS['done']} {n} finished {'task' if n == 1 else 'tasks'} folded · f shows them"
            style += self._style("queue--folded")
        if index == self.cursor:
            style += self._style("queue--cursor")
        return Strip([Segment(cut_end(text, width), style)]).crop_extend(0, width, style)

    def _line(self, cells: list[tuple[str, Column]], style: Style, width: int) -> Strip:
        parts: list[str] = []
        for value, col in cells:
            text = cut_middle(value, col.width) if col.key == "name" else cut_end(value, col.width)
            pad = col.width - cell_len(text)
            parts.append(" " * pad + text if col.right else text + " " * pad)
        return Strip([Segment(" ".join(parts), style)]).crop_extend(0, width, style)


def band_is_attention(task: Task, model: QueueModel) -> bool:
    return model.is_asking(task) or task.status.value == "needs_human"


class FilterInput(Input):
    """The ``/`` filter box; Escape clears and hides it."""

    BINDINGS = [Binding("escape", "clear_filter", "Clear filter", show=False)]

    class Cleared(Message):
        pass

    def action_clear_filter(self) -> None:
        self.value = ""
        self.display = False
        self.post_message(self.Cleared())


class JumpInput(Input):
    """The ``j`` jump box: each key moves the cursor to the best fuzzy match of a task name;
    down/up (or tab) step through the other matches, Enter stays there, Escape goes back."""

    BINDINGS = [
        Binding("enter", "accept", "stay there", show=False),
        Binding("escape", "cancel", "back", show=False),
        Binding("down", "step(1)", "next match", show=False),
        Binding("tab", "step(1)", "next match", show=False),
        Binding("up", "step(-1)", "previous match", show=False),
    ]

    class Step(Message):
        def __init__(self, step: int) -> None:
            self.step = step
            super().__init__()

    class Cancelled(Message):
        pass

    def action_step(self, step: int) -> None:
        self.post_message(self.Step(step))

    def _close(self) -> None:
        """Hide and give the focus back to the queue now, inside the key's handler: a key typed
        right after Enter or Escape (fast typing, a paste, ssh batching) must reach the queue's
        bindings, not this box."""
        self.display = False
        for queue in self.screen.query(QueueView):
            focus_now(queue)

    def action_accept(self) -> None:
        with self.prevent(Input.Changed):
            self.value = ""
        self._close()

    def action_cancel(self) -> None:
        with self.prevent(Input.Changed):
            self.value = ""
        self._close()
        self.post_message(self.Cancelled())
