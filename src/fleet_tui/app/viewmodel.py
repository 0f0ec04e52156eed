"""What the cockpit knows about the fleet, and what changed: the cockpit's view model.

The cockpit learns about the fleet two ways: a frozen ``Snapshot`` pulled about once a second (the
memray-style pull: header, gauges, and any task change the live stream missed) and batches of
``EngineEvent`` pushed by ``subscribe()``. ``CockpitState`` applies both and answers every time
with a ``Changes``: which task rows must be rewritten, which vanished, whether the questions, the
gauges or the state counts moved, which agent events and notices arrived. The app turns a
``Changes`` into pane updates in one place (``FleetApp.show``), so the rules of merging (a newer
live task wins over an older snapshot, a question asked after a snapshot survives it) live here,
testable without Textual. Nothing here imports Textual or Rich.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Literal

from fleet_tui.scheduler.model import (
    AgentEvent,
    EngineEvent,
    Event,
    GaugesChanged,
    Notice,
    Question,
    QuestionChanged,
    Snapshot,
    Task,
    TaskChanged,
)

Pane = Literal["queue", "stream", "inbox", "header", "gauges"]


@dataclass(frozen=True)
class Changes:
    """What one snapshot or one batch changed in the cockpit's state."""

    #: the first snapshot: every row is new
    first: bool = False
    #: tasks added or changed (each once, its newest version): their rows are rewritten
    tasks: tuple[Task, ...] = ()
    #: ids of tasks gone from the store
    gone: tuple[str, ...] = ()
    #: ids of tasks that started or stopped asking a question
    asking_flipped: frozenset[str] = frozenset()
    #: the pending questions changed
    questions: bool = False
    #: questions never seen before (the cockpit rings the bell)
    new_questions: tuple[str, ...] = ()
    #: agent events, in arrival order
    events: tuple[Event, ...] = ()
    #: lines for the person
    notices: tuple[str, ...] = ()
    #: the gauges changed
    gauges: bool = False
    #: a task appeared, vanished or changed state: the header recounts
    counts: bool = False
    #: a new snapshot was taken (elapsed times, the header's age, the gauges' pulse)
    snapshot: bool = False

    @property
    def rows(self) -> frozenset[str]:
        """Task ids whose queue row must be written again."""
        return frozenset(t.id for t in self.tasks) | self.asking_flipped

    @property
    def panes(self) -> frozenset[Pane]:
        out: set[Pane] = set()
        if self.first or self.tasks or self.gone or self.asking_flipped:
            out.add("queue")
        if self.events:
            out.add("stream")
        if self.first or self.questions:
            out.add("inbox")
        if self.snapshot or self.counts or self.questions or self.gauges:
            out.add("header")
        if self.snapshot or self.gauges:
            out.add("gauges")
        return frozenset(out)

    @property
    def empty(self) -> bool:
        return not (self.panes or self.notices)


@dataclass
class CockpitState:
    """The fleet as the cockpit shows it: tasks by id, pending questions, the last snapshot."""

    snap: Snapshot = field(default_factory=lambda: Snapshot(taken_at=0.0))
    tasks: dict[str, Task] = field(default_factory=dict)
    questions: dict[str, Question] = field(default_factory=dict)
    _seen_questions: set[str] = field(default_factory=set)
    _snap_tasks: tuple[Task, ...] | None = None
    _asking: frozenset[str] = frozenset()

    @property
    def asking(self) -> frozenset[str]:
        """Ids of tasks with a pending question."""
        return self._asking

    def now(self) -> Snapshot:
        """The last snapshot with the live tasks (what the header counts)."""
        return replace(self.snap, tasks=tuple(self.tasks.values()))

    # ------------------------------------------------------------------ applying

    def apply_snapshot(self, snap: Snapshot) -> Changes:
        """A pulled snapshot. The same task tuple as last time costs nothing, and a task object
        already held is skipped by identity (the engine hands unchanged tasks over as the same
        objects); a live task newer than the snapshot's copy stays."""
        first = self._snap_tasks is None
        changed: list[Task] = []
        gone: list[str] = []
        counts = False
        if snap.tasks is not self._snap_tasks:
            self._snap_tasks = snap.tasks
            changed, gone, counts = self._merge_tasks(snap)
        pending = {q.id: q for q in snap.questions if q.status == "pending"}
        for qid, q in self.questions.items():  # asked after the snapshot was taken
            if qid not in pending and q.asked_at >= snap.taken_at:
                pending[qid] = q
        gauges = snap.gauges != self.snap.gauges
        self.snap = snap
        questions = pending != self.questions
        flipped, new = self._set_questions(pending) if questions or first else (frozenset(), ())
        return Changes(
            first=first,
            tasks=tuple(changed),
            gone=tuple(gone),
            asking_flipped=flipped,
            questions=questions,
            new_questions=new,
            gauges=gauges,
            counts=counts or bool(flipped),
            snapshot=True,
        )

    def _merge_tasks(self, snap: Snapshot) -> tuple[list[Task], list[str], bool]:
        tasks = self.tasks
        changed: list[Task] = []
        for task in snap.tasks:
            live = tasks.get(task.id)
            if live is task or (live is not None and live.updated_at > task.updated_at):
                continue
            if live is None or live != task:
                tasks[task.id] = task
                changed.append(task)
        gone: list[str] = []
        if len(tasks) != len(snap.tasks):
            ids = {t.id for t in snap.tasks}
            # a task added (live) after the snapshot was taken stays
            gone = [tid for tid, t in tasks.items() if tid not in ids and t.updated_at < snap.taken_at]
            for tid in gone:
                del tasks[tid]
        return changed, gone, bool(changed or gone)

    def apply(self, batch: Iterable[EngineEvent]) -> Changes:
        """A batch of live events (or a command's resulting task, as a ``TaskChanged``)."""
        changed: dict[str, Task] = {}
        events: list[Event] = []
        notices: list[str] = []
        questions: dict[str, Question] | None = None
        gauges = counts = False
        for ee in batch:
            match ee:
                case TaskChanged(task):
                    old = self.tasks.get(task.id)
                    if old is None or task.updated_at >= old.updated_at:
                        self.tasks[task.id] = task
                        changed[task.id] = task
                        counts = counts or old is None or old.status != task.status
                case AgentEvent(event):
                    events.append(event)
                case QuestionChanged(q):
                    if questions is None:
                        questions = dict(self.questions)
                    if q.status == "pending":
                        questions[q.id] = q
                    else:
                        questions.pop(q.id, None)
                case GaugesChanged(g):
                    if g != self.snap.gauges:
                        self.snap = replace(self.snap, gauges=g)
                        gauges = True
                case Notice(text):
                    if text:
                        notices.append(text)
        flipped: frozenset[str] = frozenset()
        new: tuple[str, ...] = ()
        if questions is not None:
            flipped, new = self._set_questions(questions)
        return Changes(
            tasks=tuple(changed.values()),
            asking_flipped=flipped,
            questions=questions is not None,
            new_questions=new,
            events=tuple(events),
            notices=tuple(notices),
            gauges=gauges,
            counts=counts or questions is not None,
        )

    def _set_questions(self, pending: dict[str, Question]) -> tuple[frozenset[str], tuple[str, ...]]:
        new = tuple(qid for qid in pending if qid not in self._seen_questions)
        self._seen_questions.update(pending)
        self.questions = pending
        before, self._asking = self._asking, frozenset(q.task_id for q in pending.values())
        return before ^ self._asking, new
