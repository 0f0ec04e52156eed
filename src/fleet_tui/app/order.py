"""The queue's order, grouping, folding and name jump, kept apart from any widget.

A person steering a large backlog needs an order that means something and holds still: tasks that
need the person first (asking a question, ``needs_human``), then running/verifying, then paused,
then queued in the order ``plan`` would start them, then finished tasks newest first. A sort key
(priority, age, name, cost) orders tasks *within* those bands, so a task that needs you never
scrolls away. Tasks are grouped by repository (the git root of their ``cwd``, or the ``cwd``
itself outside git); ``status --group repo`` prints the same groups.

``QueueModel`` holds the tasks and keeps each group's tasks sorted incrementally: a change that
does not move a task (tokens, cost under the priority sort, a new waiting reason) only marks its
row; a change that moves it is one bisect out and one bisect in. The list of display rows is
rebuilt only when something moved, and only on demand. Nothing here imports Textual.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from fleet_tui.app.format import TaskFilter
from fleet_tui.repos import group_order, repo_labels, repo_root, urgency
from fleet_tui.scheduler.model import Task
from fleet_tui.scheduler.states import TaskStatus

#: the sort orders the ``o`` key cycles through, in order
SORTS: tuple[str, ...] = ("priority", "age", "name", "cost")

FINISHED = frozenset({TaskStatus.DONE, TaskStatus.CANCELLED})
ATTENTION_BAND = 0
FINISHED_BAND = 4


#: each state's band, looked up by member (``.value`` on ten thousand tasks is measurably slow)
_BAND_OF: dict[TaskStatus, int] = {s: urgency(s.value) for s in TaskStatus}


def band(task: Task, asking: bool = False) -> int:
    """0 needs the person, 1 running/verifying, 2 paused, 3 queued, 4 finished (``repos.urgency``)."""
    b = _BAND_OF.get(task.status, 3)
    return ATTENTION_BAND if asking and b < FINISHED_BAND else b


SortKey = tuple[object, ...]


def sort_key(task: Task, asking: bool, order: str = "priority") -> SortKey:
    """The position of a task in its group. The last element is always the id (a total order)."""
    b = band(task, asking)
    if order == "name":
        return (b, task.name, task.id)
    if order == "cost":
        return (b, -task.cost_usd, -task.tokens, task.created_at, task.id)
    if order == "age":
        return (b, task.created_at, task.id)
    # priority: the order the engine claims in, per band
    if b == ATTENTION_BAND:
        return (b, 0 if asking else 1, task.updated_at, task.id)  # longest waiting first
    if b == FINISHED_BAND:
        return (b, -(task.finished_at or task.updated_at), task.id)  # newest first
    return (b, -task.spec.priority, task.created_at, task.id)


# ----------------------------------------------------------------------------------- repositories


def repo_of(task: Task) -> str:
    return repo_root(task.spec.cwd)


def repo_matches(label: str, root: str, wanted: str) -> bool:
    """``repo:NAME``: NAME is a prefix of the label or of the folder name, or a part of the path."""
    wanted = wanted.lower()
    base = os.path.basename(root.rstrip("/")).lower()
    return label.lower().startswith(wanted) or base.startswith(wanted) or wanted in root.lower()


# ----------------------------------------------------------------------------------- name jump


def fuzzy_score(query: str, name: str) -> float | None:
    """How well ``query`` matches ``name`` (higher is better), or None if it does not.

    A substring beats a scattered match; an earlier and tighter match beats a later one; a
    shorter name breaks ties (``api`` finds ``api`` before ``api-client``)."""
    q = query.lower().strip()
    n = name.lower()
    if not q:
        return None
    at = n.find(q)
    if at >= 0:
        return 2000.0 - (0 if at == 0 else 100 + at) - len(n) * 0.01
    pos = -1
    gaps = 0
    first = -1
    for ch in q:
        j = n.find(ch, pos + 1)
        if j < 0:
            return None
        if first < 0:
            first = j
        gaps += j - pos - 1 if pos >= 0 else 0
        pos = j
    return 1000.0 - gaps * 10 - first - len(n) * 0.01


# ----------------------------------------------------------------------------------- the model


class Row(NamedTuple):
    """One display row: a group header, a task, or the count of a group's folded finished tasks.
    (A named tuple: ten thousand of them are made and hashed on each rebuild.)"""

    kind: str  # "group" | "task" | "folded"
    ref: str  # the group's root, or the task id

    @property
    def is_task(self) -> bool:
        return self.kind == "task"


@dataclass(frozen=True)
class GroupInfo:
    root: str
    label: str
    counts: tuple[tuple[str, int], ...]  # (state or "asking", n), only the states present
    total: int
    shown: int  # tasks of the group that match the filter
    finished: int  # finished tasks of the group that match the filter
    collapsed: bool


class QueueModel:
    """The tasks, their order and grouping, and the display rows derived from them."""

    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}
        self.asking: frozenset[str] = frozenset()
        self.order = SORTS[0]
        self.filter = TaskFilter()
        self.repo_filter: tuple[str, ...] = ()
        self.show_finished = False
        self.collapsed: set[str] = set()
        self._keys: dict[str, SortKey] = {}
        self._group_of: dict[str, str] = {}
        self._sorted: dict[str, list[tuple[SortKey, str]]] = {}
        self._labels: dict[str, str] = {}
        self._rows: list[Row] | None = []
        self._index: dict[Row, int] = {}
        self._groups: dict[str, GroupInfo] = {}
        self._task_rows = 0
        self._showing_finished = False
        self.max_name = 0

    def ids_in(self, group: str) -> list[str]:
        """The task ids of ``group`` in the queue's order."""
        return [tid for _, tid in self._sorted.get(group, [])]

    # -- changes ---------------------------------------------------------------------------------

    def is_asking(self, task: Task) -> bool:
        return task.asking or task.id in self.asking

    def upsert(self, task: Task) -> bool:
        """Take a new version of a task. True when its row moved, appeared or changed group (the
        rows must be rebuilt); False when only its cells changed."""
        old = self.tasks.get(task.id)
        self.tasks[task.id] = task
        key = sort_key(task, self.is_asking(task), self.order)
        group = repo_of(task)
        self.max_name = max(self.max_name, len(task.name))
        if old is not None and self._keys.get(task.id) == key and self._group_of.get(task.id) == group:
            if self._counts_changed(old, task) or not self.filter.empty:
                self._rows = None  # group counts or filter membership may differ
                return True
            return False
        self._remove_entry(task.id)
        self._keys[task.id] = key
        self._group_of[task.id] = group
        entries = self._sorted.setdefault(group, [])
        bisect.insort(entries, (key, task.id))
        if group not in self._labels:
            self._labels = repo_labels(self._sorted)
        self._rows = None
        return True

    def _counts_changed(self, old: Task, new: Task) -> bool:
        return old.status != new.status or old.asking != new.asking

    def remove(self, task_id: str) -> None:
        if self.tasks.pop(task_id, None) is not None:
            self._remove_entry(task_id)
            self._rows = None

    def _remove_entry(self, task_id: str) -> None:
        key = self._keys.pop(task_id, None)
        group = self._group_of.pop(task_id, None)
        if key is None or group is None:
            return
        entries = self._sorted[group]
        i = bisect.bisect_left(entries, (key, task_id))
        if i < len(entries) and entries[i] == (key, task_id):
            del entries[i]
        if not entries:
            del self._sorted[group]
            self._labels = repo_labels(self._sorted)

    def replace_all(self, tasks: Iterable[Task]) -> None:
        """Start over from a full list (the first snapshot, or a new sort order)."""
        self.tasks = {t.id: t for t in tasks}
        self._resort()

    def _resort(self) -> None:
        self._keys.clear()
        self._group_of.clear()
        self._sorted = {}
        for t in self.tasks.values():
            key = sort_key(t, self.is_asking(t), self.order)
            group = repo_of(t)
            self._keys[t.id] = key
            self._group_of[t.id] = group
            self._sorted.setdefault(group, []).append((key, t.id))
        for entries in self._sorted.values():
            entries.sort()
        self._labels = repo_labels(self._sorted)
        self.max_name = max((len(t.name) for t in self.tasks.values()), default=0)
        self._rows = None

    def set_asking(self, asking: frozenset[str]) -> set[str]:
        """New set of tasks with a pending question; returns the ids whose asking flag flipped."""
        flipped = set(self.asking ^ asking)
        self.asking = asking
        for tid in flipped:
            if (task := self.tasks.get(tid)) is not None:
                self._remove_entry(tid)  # re-key: asking moves it to the top band
                self.upsert(task)
                self._rows = None
        return flipped

    def set_order(self, order: str) -> None:
        if order != self.order:
            self.order = order
            self._resort()

    def set_filter(self, flt: TaskFilter, repos: tuple[str, ...] = ()) -> None:
        self.filter = flt
        self.repo_filter = repos
        self._rows = None

    def set_show_finished(self, show: bool) -> None:
        self.show_finished = show
        self._rows = None

    def toggle_group(self, root: str, collapsed: bool | None = None) -> None:
        want = root not in self.collapsed if collapsed is None else collapsed
        if want:
            self.collapsed.add(root)
        else:
            self.collapsed.discard(root)
        self._rows = None

    # -- reading ---------------------------------------------------------------------------------

    @property
    def grouped(self) -> bool:
        """Group headers appear once the fleet spans more than one repository."""
        return len(self._sorted) > 1

    @property
    def dirty(self) -> bool:
        return self._rows is None

    def group_of(self, task_id: str) -> str | None:
        return self._group_of.get(task_id)

    def label(self, root: str) -> str:
        return self._labels.get(root, root)

    def group(self, root: str) -> GroupInfo | None:
        self.rows()
        return self._groups.get(root)

    def folded(self) -> int:
        """Finished tasks folded away (0 while they are shown)."""
        self.rows()
        return 0 if self._showing_finished else sum(g.finished for g in self._groups.values())

    def matches(self, task: Task) -> bool:
        if not self.filter.matches(task, self.is_asking(task)):
            return False
        if not self.repo_filter:
            return True
        root = self._group_of.get(task.id, "")
        return any(repo_matches(self.label(root), root, r) for r in self.repo_filter)

    def _group_order(self) -> list[str]:
        # every sort key starts with the band: a group's first entry is its most urgent task
        urgencies = {r: int(entries[0][0][0]) for r, entries in self._sorted.items()}  # type: ignore[call-overload]
        return group_order({r: self.label(r) for r in self._sorted}, urgencies)

    def rows(self) -> list[Row]:
        """The display rows (rebuilt only after something moved)."""
        if self._rows is not None:
            return self._rows
        rows: list[Row] = []
        groups: dict[str, GroupInfo] = {}
        grouped = self.grouped
        filtering = not (self.filter.empty and not self.repo_filter)
        # a filter that names a finished state shows those tasks rather than a folded count
        show_finished = self.show_finished or any(
            "done".startswith(s) or "cancelled".startswith(s) for s in self.filter.states if s
        )
        self._showing_finished = show_finished
        tasks, asking = self.tasks, self.asking
        for root in self._group_order():
            entries = self._sorted[root]
            counts: dict[object, int] = {}
            shown: list[str] = []
            finished = 0
            for key, tid in entries:
                task = tasks[tid]
                b = key[0]  # every sort key starts with the band
                state: object = (
                    "asking" if b == ATTENTION_BAND and (task.asking or tid in asking) else task.status
                )
                counts[state] = counts.get(state, 0) + 1
                if filtering and not self.matches(task):
                    continue
                if b == FINISHED_BAND:
                    finished += 1
                    if not show_finished:
                        continue
                shown.append(tid)
            if filtering and not shown and not finished:
                continue
            collapsed = grouped and root in self.collapsed
            info = GroupInfo(
                root,
                self.label(root),
                tuple(
                    sorted(
                        ((k.value if isinstance(k, TaskStatus) else str(k), n) for k, n in counts.items()),
                        key=lambda kv: _STATE_ORDER.get(kv[0], 9),
                    )
                ),
                len(entries),
                len(shown) + (0 if show_finished else finished),
                finished,
                collapsed,
            )
            groups[root] = info
            if grouped:
                rows.append(Row("group", root))
            if collapsed:
                continue
            rows.extend(Row("task", tid) for tid in shown)
            if finished and not show_finished:
                rows.append(Row("folded", root))
        self._rows = rows
        self._task_rows = sum(1 for r in rows if r.kind == "task")
        self._groups = groups
        self._index = {row: i for i, row in enumerate(rows)}
        return rows

    def index(self, row: Row) -> int | None:
        self.rows()
        return self._index.get(row)

    def task_count(self) -> int:
        """Task rows on display (not headers or folded counts)."""
        self.rows()
        return self._task_rows

    def reveal(self, task_id: str) -> None:
        """Make a task's row visible: expand its group, show finished tasks if it is one."""
        task = self.tasks.get(task_id)
        if task is None:
            return
        root = self._group_of.get(task_id)
        if root is not None and root in self.collapsed:
            self.toggle_group(root, False)
        if task.status in FINISHED and not self.show_finished:
            self.set_show_finished(True)

    def jump(self, query: str) -> list[str]:
        """Task ids matching ``query``, best first (display order breaks ties)."""
        self.rows()
        scored: list[tuple[float, int, str]] = []
        position = 0
        for root in self._group_order():
            for _, tid in self._sorted[root]:
                position += 1
                task = self.tasks[tid]
                score = fuzzy_score(query, task.name)
                if score is not None and self.matches(task):
                    scored.append((-score, position, tid))
        scored.sort()
        return [tid for _, _, tid in scored]


_STATE_ORDER = {
    "asking": 0,
    "needs_human": 1,
    "running": 2,
    "verifying": 3,
    "paused": 4,
    "queued": 5,
    "done": 6,
    "cancelled": 7,
}
