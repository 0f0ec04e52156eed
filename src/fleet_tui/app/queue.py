"""The queue pane: one DataTable row per task, updated cell by cell.

A fleet can have hundreds of tasks changing several times a second; rebuilding the table on each
change would reset the cursor and cost a full re-layout. ``QueueTable`` remembers the values it
last wrote per row and calls ``update_cell`` only for cells that changed, adds rows for new tasks
and removes rows of tasks that vanished or no longer match the filter.
"""

from __future__ import annotations

from collections.abc import Iterable

from textual.binding import Binding
from textual.message import Message
from textual.widget import Widget
from textual.widgets import DataTable, Input
from textual.widgets.data_table import RowDoesNotExist

from fleet_tui.app.format import QUEUE_COLUMNS, TaskFilter, row_values
from fleet_tui.scheduler.model import Task


def focus_now(widget: Widget) -> None:
    """Move focus before the next queued key is handled.

    ``Widget.focus()`` defers the change, so keys typed fast (or pasted) right after ``/`` or ``a``
    would still reach the cockpit's bindings: ``/state:run`` would open a shell on ``s``.
    """
    try:
        widget.screen.set_focus(widget)
    except Exception:
        widget.focus()


class QueueTable(DataTable[str]):
    """The task queue. Row keys are task ids."""

    BINDINGS = [Binding("enter", "select_cursor", "detail", key_display="⏎")]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=False)
        self._written: dict[str, dict[str, str]] = {}
        self.filter = TaskFilter()

    def on_mount(self) -> None:
        for key, label, width in QUEUE_COLUMNS:
            self.add_column(label, key=key, width=width)

    @property
    def selected_id(self) -> str | None:
        if not self.row_count:
            return None
        try:
            key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        except Exception:
            return None
        return key.value

    def select_id(self, task_id: str) -> bool:
        try:
            self.move_cursor(row=self.get_row_index(task_id))
        except RowDoesNotExist:
            return False
        return True

    def sync(self, tasks: Iterable[Task], now: float, asking: frozenset[str] = frozenset()) -> None:
        """Make the rows match ``tasks`` (in order of first appearance), touching only changes."""
        seen: set[str] = set()
        for task in tasks:
            is_asking = task.asking or task.id in asking
            if not self.filter.matches(task, is_asking):
                continue
            seen.add(task.id)
            values = row_values(task, now, is_asking)
            old = self._written.get(task.id)
            if old is None:
                self.add_row(*(values[k] for k, _, _ in QUEUE_COLUMNS), key=task.id)
            else:
                for key, value in values.items():
                    if old.get(key) != value:
                        self.update_cell(task.id, key, value)
            self._written[task.id] = values
        for gone in [tid for tid in self._written if tid not in seen]:
            self.remove_task(gone)

    def update_task(self, task: Task, now: float, asking: bool = False) -> None:
        """Apply one task change (from a live event) without touching other rows."""
        is_asking = task.asking or asking
        if not self.filter.matches(task, is_asking):
            self.remove_task(task.id)
            return
        values = row_values(task, now, is_asking)
        old = self._written.get(task.id)
        if old is None:
            self.add_row(*(values[k] for k, _, _ in QUEUE_COLUMNS), key=task.id)
        else:
            for key, value in values.items():
                if old.get(key) != value:
                    self.update_cell(task.id, key, value)
        self._written[task.id] = values

    def remove_task(self, task_id: str) -> None:
        if self._written.pop(task_id, None) is not None:
            try:
                self.remove_row(task_id)
            except RowDoesNotExist:
                pass

    def set_filter(self, flt: TaskFilter, tasks: Iterable[Task], now: float, asking: frozenset[str]) -> None:
        """A new filter is a user action: rows are rebuilt once, in task order, keeping the cursor."""
        selected = self.selected_id
        self.filter = flt
        self.clear()
        self._written.clear()
        self.sync(tasks, now, asking)
        if selected is not None:
            self.select_id(selected)

    def go_top(self) -> None:
        self.move_cursor(row=0)

    def go_bottom(self) -> None:
        self.move_cursor(row=max(self.row_count - 1, 0))


class FilterInput(Input):
    """The ``/`` filter box; Escape clears and hides it."""

    BINDINGS = [Binding("escape", "clear_filter", "Clear filter", show=False)]

    class Cleared(Message):
        pass

    def action_clear_filter(self) -> None:
        self.value = ""
        self.display = False
        self.post_message(self.Cleared())
