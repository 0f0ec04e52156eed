"""The lifecycle: reasons read back byte for byte, named moves that say today's strings, each
state's entry effects, and ``Lifecycle.apply`` (fences, publication, dependents) on a real store."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_tui.scheduler import lifecycle as lc
from fleet_tui.scheduler.lifecycle import Lifecycle, Reason, ReasonCode
from fleet_tui.scheduler.model import Task, TaskSpec
from fleet_tui.scheduler.states import IllegalTransition, TaskStatus, entry_fields
from fleet_tui.scheduler.store.sqlite_store import SqliteStore

pytestmark = pytest.mark.timeout(60)

Q, R, V, D, H, P, C = (
    TaskStatus.QUEUED,
    TaskStatus.RUNNING,
    TaskStatus.VERIFYING,
    TaskStatus.DONE,
    TaskStatus.NEEDS_HUMAN,
    TaskStatus.PAUSED,
    TaskStatus.CANCELLED,
)

#: reasons as stores hold them today (written by the engine, the CLI, the cockpit, GitHub)
STORED = [
    "killed_by_user",
    "cancelled by user",
    "retry by user",
    "paused by user",
    "resumed by user",
    "resumed; its engine had stopped",
    "resumed: the attempt crashed",
    "resumed: its supervisor lost it",
    "never_started: the agent could not be started",
    "never_started: cwd /x does not exist (fix the task's cwd, then retry)",
    "could not prepare the attempt ([Errno 28] No space left on device); trying again in a minute",
    "dependency_failed: mid ← base (retries_exhausted)",
    "dependency_failed: base (cancelled)",
    "dependency base retried",
    "approved_by:ann",
    "taken over by ann",
    "taken over by ",
    "parked after takeover by ann",
    "requeued after takeover by ann",
    "verified after takeover by ann",
    "verify_failed: run: false (after takeover by ann)",
    "verify_failed: run: pytest",
    "follow-up by ann",
    "merge_conflict: a.py, b.py",
    "merge_conflict",
    "push_rejected: no git remote",
    "pull_request_failed: HTTP 422",
    "changes_requested: pull request #3: rename it",
    "auto_merge_refused: the base has uncommitted changes",
    "merged 0123456789abcdef",
    "merged None",
    "merged 0123456789 via pull request #4",
    "pull request #4 opened: https://github.example/o/r/pull/4",
    "over_budget: spent $2.00 of the $2.00 budget",
    "crashed: 3 attempts in a row ended without an exit status",
    "retries_exhausted",
    "false_completion",
    "context_pressure",
    "context handoff: 91% of the window",
    "stalled",
    "timeout: 30 min",
    "auth_failed: not logged in",
    "looping: same call 8 times",
    "failed: exit 1",
    "",
    "dependency_failed:base",  # an unusual spelling stays as it was
    "something nobody wrote before",
]


@pytest.mark.parametrize("text", STORED)
def test_every_stored_reason_reads_back_to_the_same_string(text: str) -> None:
    assert Reason.parse(text).text == text


def test_reasons_say_what_they_are() -> None:
    assert Reason.parse("merge_conflict: a.py") == Reason(ReasonCode.MERGE_CONFLICT, "a.py")
    assert Reason.parse("resumed by user").code == ReasonCode.RESUMED_BY_USER
    assert Reason.parse("resumed: the attempt crashed").code == ReasonCode.RESUMED
    assert Reason.parse("taken over by ann") == Reason(ReasonCode.TAKEN_OVER, "ann")
    assert Reason.parse("retries_exhausted").code == ReasonCode.OTHER
    assert Reason.parse("dependency_failed: mid ← base (retries_exhausted)").parent == "mid"
    assert Reason.parse("merge_conflict: x").parent is None


def test_named_moves_write_todays_reasons_and_fields() -> None:
    def said(m: lc.Move) -> tuple[TaskStatus, str | None, dict[str, object]]:
        return m.dst, lc.text_of(m.reason), dict(m.fields)

    fresh = {"retries_used": 0, "false_completions": 0, "handoffs": 0, "not_before": None}
    assert said(lc.kill()) == (H, "killed_by_user", {"paused_running": 0})
    assert said(lc.cancel()) == (C, "cancelled by user", {"paused_running": 0})
    assert said(lc.retry()) == (Q, "retry by user", {**fresh, "paused_running": 0})
    assert said(lc.retry(queued=True)) == (Q, "retry by user", {"not_before": None})
    assert said(lc.pause()) == (P, "paused by user", {"paused_running": 0})
    assert said(lc.resume()) == (Q, "resumed by user", {})
    assert said(lc.resume(engine_gone=True)) == (Q, "resumed; its engine had stopped", {"paused_running": 0})
    assert said(lc.pause_live()) == (P, "paused by user", {"paused_running": 1})
    assert said(lc.resume_live()) == (R, "resumed by user", {"paused_running": 0})
    assert said(lc.approve("ann")) == (D, "approved_by:ann", {"paused_running": 0})
    assert said(lc.take_over("ann")) == (H, "taken over by ann", {"paused_running": 0})
    assert said(lc.follow_up("ann")) == (Q, "follow-up by ann", {**fresh, "paused_running": 0})
    assert said(lc.requeue_after_takeover("ann")) == (Q, "requeued after takeover by ann", fresh)
    assert said(lc.never_started("no cwd"))[:2] == (H, "never_started: no cwd")
    assert said(lc.requeue_later("disk full", 7.0)) == (
        Q,
        "could not prepare the attempt (disk full); trying again in a minute",
        {"not_before": 7.0},
    )
    assert said(lc.requeue_crashed()) == (Q, "resumed: the attempt crashed", {"paused_running": 0})
    assert said(lc.start_verifying()) == (V, None, {})
    assert said(lc.mark_merged("abc")) == (D, "merged abc", {"merged_commit": "abc"})
    assert said(lc.merge_conflict(["a.py", "b.py"]))[:2] == (H, "merge_conflict: a.py, b.py")
    assert said(lc.auto_merge_refused("dirty"))[:2] == (D, "auto_merge_refused: dirty")
    assert lc.dependency_failed("mid", "base", "cancelled").reason == Reason.parse(
        "dependency_failed: mid ← base (cancelled)"
    )
    assert (
        lc.text_of(lc.dependency_failed("base", "base", "cancelled").reason)
        == "dependency_failed: base (cancelled)"
    )
    assert lc.text_of(lc.dependency_retried("base").reason) == "dependency base retried"


def test_entry_effects_of_each_state() -> None:
    # entering a finished state stamps finished_at, and lets go of the claim
    assert entry_fields(R, H, now=5.0, finished_at=None, fields={}) == {
        "finished_at": 5.0,
        "owner": None,
        "lease_until": None,
        "waiting": None,
    }
    # between finished states (a merge conflict on a done task) the first finish time stays
    assert "finished_at" not in entry_fields(D, H, now=9.0, finished_at=5.0, fields={})
    # back to the queue: the claim goes, the gate's note stays for the planner to rewrite
    assert entry_fields(R, Q, now=5.0, finished_at=None, fields={}) == {"owner": None, "lease_until": None}
    # a running move keeps its owner; what the caller gives wins
    assert entry_fields(P, R, now=5.0, finished_at=None, fields={"paused_running": 0}) == {
        "paused_running": 0,
        "waiting": None,
    }
    assert entry_fields(R, D, now=5.0, finished_at=None, fields={"owner": "e1", "waiting": "x"}) == {
        "owner": "e1",
        "waiting": "x",
        "finished_at": 5.0,
    }


@pytest.fixture
def store(tmp_path: Path) -> SqliteStore:
    return SqliteStore(str(tmp_path / "fleet.db"))


def _claimed(store: SqliteStore, name: str, owner: str = "e1") -> Task:
    task = store.claim(owner, "h", (), 2.0, 30.0, "sim", None, only_task=store.get_task(name).id)  # type: ignore[union-attr]
    assert task is not None
    return task


def test_apply_is_fenced_and_published(store: SqliteStore) -> None:
    store.add_tasks([TaskSpec(name="a", prompt="p")], 1.0)
    seen: list[Task] = []
    mine = Lifecycle(store, lambda: 3.0, "e1", seen.append)
    theirs = Lifecycle(store, lambda: 3.0, "e2", seen.append)
    task = _claimed(store, "a")
    assert theirs.apply(task, lc.start_verifying(), held=True) is None  # not their claim
    moved = mine.apply(task, lc.start_verifying(), held=True)
    assert moved is not None and moved.status == V and seen == [moved]
    assert mine.apply(task, lc.kill()) is None  # seen running: it is verifying now
    with pytest.raises(IllegalTransition):
        mine.apply(moved, lc.pause())
    done = mine.apply(moved, lc.verdict(D, None), held=True)
    assert done is not None and done.owner is None and done.finished_at == 3.0
    assert [t.status for t in seen] == [V, D]
    (row,) = [t for t in store.transitions(task.id) if t.dst == D]
    assert row.actor == "e1"


def test_a_parked_task_parks_its_dependents_and_they_come_back_with_it(store: SqliteStore) -> None:
    store.add_tasks(
        [
            TaskSpec(name="base", prompt="p"),
            TaskSpec(name="mid", prompt="p", depends_on=("base",)),
            TaskSpec(name="top", prompt="p", depends_on=("mid",)),
        ],
        1.0,
    )
    seen: list[Task] = []
    life = Lifecycle(store, lambda: 3.0, "e1", seen.append)
    base = _claimed(store, "base")
    parked = life.apply(base, lc.verdict(H, "retries_exhausted"), held=True)
    assert parked is not None
    reasons = {t.name: t.reason for t in store.list_tasks()}
    assert reasons["mid"] == "dependency_failed: base (retries_exhausted)"
    assert reasons["top"] == "dependency_failed: mid ← base (retries_exhausted)"
    assert [t.name for t in seen] == ["base", "mid", "top"]
    back = life.apply(parked, lc.retry())
    assert back is not None
    assert {t.name: (t.status, t.reason) for t in store.list_tasks()} == {
        "base": (Q, "retry by user"),
        "mid": (Q, "dependency base retried"),
        "top": (Q, "dependency mid retried"),
    }


def test_a_merge_conflict_leaves_the_dependents_alone(store: SqliteStore) -> None:
    store.add_tasks([TaskSpec(name="a", prompt="p"), TaskSpec(name="b", prompt="p", depends_on=("a",))], 1.0)
    life = Lifecycle(store, lambda: 3.0, "e1")
    done = life.apply(_claimed(store, "a"), lc.verdict(D, None), held=True)
    assert done is not None
    assert life.apply(done, lc.merge_conflict(["x.py"])) is not None
    b = store.get_task("b")
    assert b is not None and b.status == Q and b.reason is None
