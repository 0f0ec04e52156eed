"""The cockpit's view model without Textual: what a snapshot or a batch changes, and which panes."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from fleet_tui.app.viewmodel import CockpitState
from fleet_tui.scheduler.model import (
    AgentEvent,
    Event,
    Gauges,
    GaugesChanged,
    Notice,
    Question,
    QuestionChanged,
    Snapshot,
    Task,
    TaskChanged,
    TaskSpec,
)
from fleet_tui.scheduler.states import TaskStatus


def task(i: int, status: TaskStatus = TaskStatus.QUEUED, at: float = 10.0) -> Task:
    spec = TaskSpec(name=f"task-{i}", prompt="x", cwd=".")
    return Task(id=f"t-{i}", spec=spec, status=status, created_at=at, updated_at=at)


def question(
    qid: str,
    task_id: str,
    at: float = 20.0,
    status: Literal["pending", "answered", "cancelled", "expired"] = "pending",
) -> Question:
    return Question(id=qid, task_id=task_id, attempt=1, text="which?", asked_at=at, status=status)


def test_the_first_snapshot_paints_everything_and_the_same_one_again_nothing() -> None:
    st = CockpitState()
    tasks = (task(1), task(2, TaskStatus.RUNNING))
    snap = Snapshot(taken_at=30.0, tasks=tasks)
    first = st.apply_snapshot(snap)
    assert first.first and first.counts
    assert {t.id for t in first.tasks} == {"t-1", "t-2"}
    assert first.panes >= {"queue", "inbox", "header", "gauges"}
    again = st.apply_snapshot(replace(snap, taken_at=31.0))  # the same task tuple
    assert not again.first and again.tasks == () and again.gone == () and not again.counts
    assert "queue" not in again.panes and again.panes == {"header", "gauges"}


def test_a_snapshot_changes_one_row_and_drops_a_gone_task() -> None:
    st = CockpitState()
    a, b = task(1), task(2)
    st.apply_snapshot(Snapshot(taken_at=30.0, tasks=(a, b)))
    newer = replace(a, tokens=500, updated_at=31.0)
    ch = st.apply_snapshot(Snapshot(taken_at=32.0, tasks=(newer,)))
    assert ch.tasks == (newer,) and ch.gone == ("t-2",) and ch.rows == {"t-1"}
    assert st.tasks == {"t-1": newer}


def test_a_live_change_newer_than_the_snapshot_wins() -> None:
    st = CockpitState()
    a = task(1)
    st.apply_snapshot(Snapshot(taken_at=30.0, tasks=(a,)))
    live = replace(a, status=TaskStatus.RUNNING, updated_at=40.0)
    ch = st.apply([TaskChanged(live)])
    assert ch.tasks == (live,) and ch.counts and ch.panes == {"queue", "header"}
    stale = replace(a, tokens=1, updated_at=35.0)
    ch = st.apply_snapshot(Snapshot(taken_at=36.0, tasks=(stale,)))
    assert ch.tasks == () and st.tasks["t-1"] is live
    # and an older live version does not undo a newer one
    assert st.apply([TaskChanged(stale)]).tasks == ()


def test_a_batch_says_what_it_changed() -> None:
    st = CockpitState()
    a = task(1, TaskStatus.RUNNING)
    st.apply_snapshot(Snapshot(taken_at=30.0, tasks=(a,)))
    ev = Event("t-1", 1, 1, 31.0, "text", text="hello")
    t1 = replace(a, tokens=10, updated_at=31.0)
    t2 = replace(a, tokens=20, updated_at=31.5)
    g = Gauges(running=1, max_concurrent=4)
    ch = st.apply(
        [AgentEvent(ev), TaskChanged(t1), TaskChanged(t2), GaugesChanged(g), Notice("hi"), Notice("")]
    )
    assert ch.events == (ev,)
    assert ch.tasks == (t2,)  # one row write for two changes of one task
    assert not ch.counts  # tokens only: the header need not recount
    assert ch.gauges and st.snap.gauges == g
    assert ch.notices == ("hi",)
    assert ch.panes == {"queue", "stream", "header", "gauges"}
    assert st.apply([GaugesChanged(g)]).empty  # the same gauges again: nothing to draw


def test_questions_flip_the_asking_rows_and_ring_once() -> None:
    st = CockpitState()
    a, b = task(1), task(2)
    st.apply_snapshot(Snapshot(taken_at=30.0, tasks=(a, b)))
    q = question("q1", "t-1", at=31.0)
    ch = st.apply([QuestionChanged(q)])
    assert ch.questions and ch.new_questions == ("q1",) and ch.asking_flipped == {"t-1"}
    assert st.asking == {"t-1"} and "inbox" in ch.panes and "queue" in ch.panes
    # a snapshot taken before the question was asked does not drop it
    ch = st.apply_snapshot(Snapshot(taken_at=30.5, tasks=(a, b)))
    assert st.questions == {"q1": q} and not ch.questions
    # the same question seen again is no news
    assert st.apply([QuestionChanged(q)]).new_questions == ()
    ch = st.apply([QuestionChanged(replace(q, status="answered"))])
    assert ch.asking_flipped == {"t-1"} and st.asking == frozenset() and st.questions == {}


def test_now_counts_the_live_tasks() -> None:
    st = CockpitState()
    st.apply_snapshot(Snapshot(taken_at=30.0, tasks=(task(1),)))
    st.apply([TaskChanged(task(2, at=40.0))])
    assert [t.id for t in st.now().tasks] == ["t-1", "t-2"]
