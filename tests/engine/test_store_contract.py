"""One behavioural suite for the Store contract, run against SQLite and PostgreSQL.

Every engine, CLI command and cockpit relies on the same store behaviour whichever backend holds
the queue (DESIGN section 10), so each test here runs twice: on a fresh SQLite file and on a fresh
PostgreSQL schema (dropped afterwards). PostgreSQL comes from ``$FLEET_TEST_PG_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``); when it is unreachable the PostgreSQL cases skip
with the reason, except under ``CI=true`` where they fail. Select them with ``-m postgres``.

Times are explicit numbers (no sleeps, no timing asserts); the only waits poll for an outcome
with a generous deadline.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

from fleet_tui.scheduler.model import Attempt, Event, Host, RateLimit, TaskSpec, Usage
from fleet_tui.scheduler.states import IllegalTransition, TaskStatus
from fleet_tui.scheduler.store.changes import changed
from fleet_tui.scheduler.store.protocol import DuplicateName, Store, StoreError
from fleet_tui.scheduler.store.sqlite_store import SqliteStore

pytestmark = pytest.mark.timeout(90)

PG_URL = os.environ.get("FLEET_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
NOW = 1_800_000_000.0
Q, R, V, D, H, P, C = (
    TaskStatus.QUEUED,
    TaskStatus.RUNNING,
    TaskStatus.VERIFYING,
    TaskStatus.DONE,
    TaskStatus.NEEDS_HUMAN,
    TaskStatus.PAUSED,
    TaskStatus.CANCELLED,
)

_pg_problem: list[str | None] = []


def pg_unreachable() -> str | None:
    """Why PostgreSQL cannot be used for these tests, or None (checked once per session)."""
    if not _pg_problem:
        try:
            import psycopg

            psycopg.connect(PG_URL, connect_timeout=3).close()
            _pg_problem.append(None)
        except Exception as e:  # psycopg missing, refused, auth...
            _pg_problem.append(f"{type(e).__name__}: {str(e).strip().splitlines()[0]}")
    return _pg_problem[0]


def need_pg() -> None:
    why = pg_unreachable()
    if why is None:
        return
    msg = (
        f"PostgreSQL at {PG_URL} is unreachable ({why}); start it or set FLEET_TEST_PG_URL "
        "to run the PostgreSQL store tests"
    )
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg)
    pytest.skip(msg)


def drop_schema(schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


MakeStore = Callable[[], Any]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def make_store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[MakeStore]:
    """A factory of store objects on one fresh queue (each call: a new connection/object)."""
    made: list[Any] = []
    if request.param == "sqlite":
        path = str(tmp_path / "fleet.db")

        def make() -> Any:
            made.append(SqliteStore(path))
            return made[-1]

        yield make
        for s in made:
            s.close()
        return
    need_pg()
    from fleet_tui.scheduler.store.postgres_store import PostgresStore

    schema = f"fleet_test_{uuid.uuid4().hex[:12]}"

    def make_pg() -> Any:
        made.append(PostgresStore(PG_URL, schema=schema))
        return made[-1]

    try:
        yield make_pg
    finally:
        for s in made:
            s.close()
        drop_schema(schema)


@pytest.fixture
def store(make_store: MakeStore) -> Any:
    return make_store()


def spec(name: str, **kw: Any) -> TaskSpec:
    return TaskSpec(name=name, prompt=f"do {name}", **kw)


def claim(s: Store, owner: str = "e1", *, tags: tuple[str, ...] = (), now: float = NOW, **kw: Any) -> Any:
    kw.setdefault("default_coder", "sim")
    kw.setdefault("default_model", None)
    return s.claim(owner, "h1", tags, now, 60.0, **kw)


def names_claimed(s: Store, n: int, **kw: Any) -> list[str | None]:
    out: list[str | None] = []
    for _ in range(n):
        t = claim(s, **kw)
        out.append(t.name if t else None)
    return out


# -- tasks -----------------------------------------------------------------------------------------
def test_add_and_get_by_id_and_name(store: Any) -> None:
    a, b = store.add_tasks([spec("a", priority=2, requires=("gpu",)), spec("b", depends_on=("a",))], NOW)
    assert a.status == Q and a.attempt == 0 and a.created_at == NOW and a.coder is None
    assert store.get_task(a.id) == a
    assert store.get_task("a") == a
    assert store.get_task("b").spec.depends_on == ("a",)
    assert store.get_task("missing") is None
    assert [t.name for t in store.list_tasks()] == ["a", "b"]
    assert store.task_names() == {"a", "b"}
    assert store.get_task("a").spec == spec("a", priority=2, requires=("gpu",))
    assert [t.name for t in store.dependents(a.id)] == ["b"]
    assert [t.name for t in store.dependencies(b.id)] == ["a"]
    assert [(x.src, x.dst, x.reason) for x in store.transitions(a.id)] == [(None, "queued", "added")]


def test_duplicate_names_are_refused_atomically(store: Any) -> None:
    store.add_tasks([spec("a")], NOW)
    with pytest.raises(DuplicateName, match="'a' is queued: names are unique among unfinished tasks"):
        store.add_tasks([spec("b"), spec("a")], NOW)
    with pytest.raises(DuplicateName):
        store.add_tasks([spec("c"), spec("c")], NOW)
    with pytest.raises(StoreError, match="unknown task 'nope'"):
        store.add_tasks([spec("d"), spec("e", depends_on=("nope",))], NOW)
    assert store.task_names() == {"a"}
    assert claim(store).name == "a" and claim(store) is None


def test_a_finished_task_frees_its_name_and_keeps_its_records(store: Any) -> None:
    (old,) = store.add_tasks([spec("a")], NOW)
    store.transition(old.id, TaskStatus.CANCELLED, reason="cancelled by user", now=NOW)
    (new,) = store.add_tasks([spec("a")], NOW + 1)
    assert new.id != old.id and store.get_task("a").id == new.id  # by name: the newest
    assert store.get_task(old.id).name == "a" and store.get_task(old.id).status == TaskStatus.CANCELLED
    assert store.task_names() == {"a"}
    (child,) = store.add_tasks([spec("b", depends_on=("a",))], NOW + 2)
    assert [d.id for d in store.dependencies(child.id)] == [new.id]


def test_claim_order_priority_then_age(store: Any) -> None:
    store.add_tasks(
        [spec("old-low"), spec("high", priority=5), spec("new-low"), spec("mid", priority=1)], NOW
    )
    assert names_claimed(store, 5) == ["high", "mid", "old-low", "new-low", None]
    t = store.get_task("high")
    assert (t.status, t.attempt, t.owner, t.host, t.lease_until) == (R, 1, "e1", "h1", NOW + 60.0)
    assert t.started_at == NOW and t.attempt_started_at == NOW
    assert [(x.src, x.dst, x.reason, x.attempt, x.actor) for x in store.transitions(t.id)][-1] == (
        "queued",
        "running",
        "claimed",
        1,
        "e1",
    )


def test_dependencies_gate_the_claim(store: Any) -> None:
    a, _b, _c = store.add_tasks(
        [spec("a"), spec("b", depends_on=("a",)), spec("c", depends_on=("a", "b"))], NOW
    )
    assert names_claimed(store, 2) == ["a", None]
    store.transition(a.id, D, reason=None, now=NOW, owner="e1", attempt=1)
    assert names_claimed(store, 2) == ["b", None]
    store.transition(store.get_task("b").id, D, reason=None, now=NOW, owner="e1", attempt=1)
    assert names_claimed(store, 2) == ["c", None]


def test_not_before_requires_tags_and_exclude_coders(store: Any) -> None:
    store.add_tasks(
        [spec("later"), spec("gpu", requires=("gpu", "big")), spec("claude", coder="claude"), spec("plain")],
        NOW,
    )
    store.update_task(store.get_task("later").id, not_before=NOW + 100)
    # plain has the default coder sim: excluding sim leaves only claude (tags missing for gpu)
    assert claim(store, exclude_coders=("sim",)).name == "claude"
    assert claim(store, exclude_coders=("sim",)) is None
    assert claim(store, tags=("gpu",)).name == "plain"
    assert claim(store, tags=("gpu",)) is None
    assert claim(store, tags=("big", "gpu", "x")).name == "gpu"
    assert claim(store) is None
    assert claim(store, now=NOW + 100).name == "later"


def test_only_task(store: Any) -> None:
    _a, b = store.add_tasks([spec("a", priority=9), spec("b")], NOW)
    assert claim(store, only_task=b.id).name == "b"
    assert claim(store, only_task=b.id) is None
    assert claim(store, only_task="t-nonexistent") is None
    assert claim(store).name == "a"


def test_coder_and_model_frozen_at_first_claim(store: Any) -> None:
    store.add_tasks([spec("d"), spec("s", coder="codex", model="gpt-x")], NOW)
    d = claim(store, default_coder="sim", default_model="m1", only_task=store.get_task("d").id)
    assert (d.coder, d.model) == ("sim", "m1")
    store.transition(d.id, Q, reason="retry", now=NOW, owner="e1", attempt=1)
    d2 = claim(store, default_coder="claude", default_model="m2", only_task=d.id)
    assert (d2.coder, d2.model, d2.attempt, d2.started_at) == ("sim", "m1", 2, NOW)
    s = claim(store, default_coder="claude", default_model="m2")
    assert (s.coder, s.model) == ("codex", "gpt-x")
    # a frozen coder is what exclude_coders tests
    store.transition(d.id, Q, reason="retry", now=NOW, owner="e1", attempt=2)
    assert claim(store, default_coder="claude", exclude_coders=("sim",)) is None


# -- transitions -----------------------------------------------------------------------------------
def test_fenced_transitions_and_illegal_moves(store: Any) -> None:
    (a,) = store.add_tasks([spec("a")], NOW)
    t = claim(store, "e1")
    assert store.transition(a.id, V, reason=None, now=NOW, owner="e2", attempt=1) is None
    assert store.transition(a.id, V, reason=None, now=NOW, owner="e1", attempt=2) is None
    assert store.transition(a.id, V, reason=None, now=NOW, expect=[Q]) is None
    assert store.update_task(a.id, owner="e2", attempt=1, tokens=5) is None
    assert store.update_task(a.id, owner="e1", attempt=1, tokens=5, cost_usd=0.25).tokens == 5
    assert store.get_task(a.id).status == R and len(store.transitions(a.id)) == 2
    assert store.transition(a.id, Q, reason="retry", now=NOW, owner="e1", attempt=1, expect=[R]).status == Q
    n = len(store.transitions(a.id))
    with pytest.raises(IllegalTransition):
        store.transition(a.id, D, reason=None, now=NOW)  # queued -> done: forbidden
    with pytest.raises(IllegalTransition):
        store.transition(a.id, V, reason=None, now=NOW)
    assert store.get_task(a.id).status == Q and len(store.transitions(a.id)) == n
    assert t.attempt == 1
    assert store.transition("t-missing", C, reason=None, now=NOW) is None


def test_transition_rows_fields_and_clearing(store: Any) -> None:
    (a,) = store.add_tasks([spec("a")], NOW)
    claim(store, "e1", now=NOW + 1)
    p = store.transition(
        a.id, P, reason="paused by user", now=NOW + 2, owner="e1", attempt=1, paused_running=1
    )
    assert p.status == P and p.paused_running is True and p.owner == "e1" and p.reason == "paused by user"
    r = store.transition(a.id, R, reason="resumed", now=NOW + 3, owner="e1", attempt=1, paused_running=0)
    assert r.paused_running is False and r.updated_at == NOW + 3
    v = store.transition(a.id, V, reason=None, now=NOW + 4, owner="e1", attempt=1)
    d = store.transition(
        a.id, D, reason="verified", now=NOW + 5, owner="e1", attempt=1, result_text="all good", cost_usd=1.5
    )
    assert v.status == V
    assert (d.status, d.owner, d.lease_until, d.finished_at, d.result_text, d.cost_usd) == (
        D,
        None,
        None,
        NOW + 5,
        "all good",
        1.5,
    )
    rows = [(x.ts, x.src, x.dst, x.reason, x.attempt, x.actor) for x in store.transitions(a.id)]
    assert rows == [
        (NOW, None, "queued", "added", 0, None),
        (NOW + 1, "queued", "running", "claimed", 1, "e1"),
        (NOW + 2, "running", "paused", "paused by user", 1, "e1"),
        (NOW + 3, "paused", "running", "resumed", 1, "e1"),
        (NOW + 4, "running", "verifying", None, 1, "e1"),
        (NOW + 5, "verifying", "done", "verified", 1, "e1"),
    ]
    m = store.transition(
        a.id, D, reason="merged abc", now=NOW + 6, expect=[D], actor="cli", merged_commit="abc"
    )
    assert m.merged_commit == "abc" and store.transitions(a.id)[-1].actor == "cli"


def test_set_waiting(store: Any) -> None:
    a, b = store.add_tasks([spec("a"), spec("b")], NOW)
    claim(store, only_task=b.id)
    store.set_waiting({a.id: "after user-schema", b.id: "memory low"})
    assert store.get_task(a.id).waiting == "after user-schema"
    assert store.get_task(b.id).waiting is None  # only queued tasks wait
    store.set_waiting({a.id: None})
    assert store.get_task(a.id).waiting is None
    store.set_waiting({})


def test_tasks_changed_since(store: Any) -> None:
    """A copy of the task list kept current from the changes alone matches a full read."""
    a, b, c = store.add_tasks([spec("a"), spec("b"), spec("c")], NOW)
    first = store.tasks_changed_since(None)
    assert first.full and [t.id for t in first.tasks] == [a.id, b.id, c.id]
    mirror = {t.id: t for t in first.tasks}
    marker = first.marker

    def catch_up() -> set[str]:
        nonlocal marker
        got = store.tasks_changed_since(marker)
        marker = got.marker
        if got.full:
            mirror.clear()
        mirror.update({t.id: t for t in got.tasks})
        assert mirror == {t.id: t for t in store.list_tasks()}
        return {t.id for t in got.tasks}

    catch_up()  # nothing happened: nothing (or, a store unable to tell, every task)
    store.set_waiting({b.id: "memory low"})
    assert b.id in catch_up()
    (d,) = store.add_tasks([spec("d")], NOW + 1)
    assert d.id in catch_up()
    claim(store, only_task=a.id)
    assert a.id in catch_up()
    store.add_question(c.id, 1, "sure?", [], NOW + 2)  # asking is part of the task
    assert c.id in catch_up() and mirror[c.id].asking
    store.close_questions(c.id, "cancelled", NOW + 3)
    assert c.id in catch_up() and not mirror[c.id].asking
    if isinstance(store, SqliteStore):  # the change counter: only what changed is read
        assert catch_up() == set()
        store.set_waiting({d.id: "slots full"})
        assert catch_up() == {d.id}


# -- engines and leases ----------------------------------------------------------------------------
def test_engines_heartbeat_and_leases(store: Any) -> None:
    store.add_tasks([spec("a"), spec("b"), spec("c")], NOW)
    store.register_engine("e1", "h1", 100, 5.0, NOW)
    store.register_engine("e2", "h2", 200, 6.0, NOW)
    a = claim(store, "e1")
    b = claim(store, "e1")
    claim(store, "e2")
    assert store.heartbeat("e1", NOW + 30, 60.0) == 2
    assert store.get_task(a.id).lease_until == NOW + 90
    assert store.get_task(b.id).lease_until == NOW + 90
    assert store.heartbeat("e1", NOW + 10, 60.0) == 2  # never shortens a lease
    assert store.get_task(a.id).lease_until == NOW + 90
    assert store.extend_lease(a.id, "e1", NOW + 500) is True
    assert store.extend_lease(a.id, "e2", NOW + 900) is False
    assert store.get_task(a.id).lease_until == NOW + 500
    info = store.engine_info("e1")
    assert info is not None and (info["host"], info["pid"], info["heartbeat"], info["stopped"]) == (
        "h1",
        100,
        NOW + 10,
        0,
    )
    assert store.engine_info("nobody") is None
    assert sorted(e["owner"] for e in store.live_engines(NOW + 40, 35.0)) == ["e1"]
    assert sorted(e["owner"] for e in store.live_engines(NOW, 30.0)) == ["e1", "e2"]
    store.unregister_engine("e1", NOW + 11)
    assert [e["owner"] for e in store.live_engines(NOW + 11, 30.0)] == ["e2"]
    assert store.engine_info("e1")["stopped"] == 1


def test_orphaned_tasks(store: Any) -> None:
    store.add_tasks(
        [spec("fresh"), spec("stale"), spec("stopped"), spec("ghost"), spec("paused"), spec("idle")], NOW
    )
    for owner in ("fresh", "stale", "stopped"):
        store.register_engine(owner, "h", 1, 1.0, NOW)
    for owner in ("fresh", "stale", "stopped", "ghost"):  # ghost never registered
        claim(store, owner, only_task=store.get_task(owner).id)
    store.register_engine("p", "h", 1, 1.0, NOW)
    pt = claim(store, "stale", only_task=store.get_task("paused").id)
    store.transition(pt.id, P, reason="paused", now=NOW, owner="stale", attempt=1, paused_running=1)
    store.heartbeat("fresh", NOW + 100, 60.0)
    store.heartbeat("stopped", NOW + 100, 60.0)
    store.unregister_engine("stopped", NOW + 100)
    orphans = [t.name for t in store.orphaned_tasks(NOW + 100, 30.0)]
    assert orphans == ["stale", "stopped", "ghost", "paused"]
    # a paused task whose agent was not running is not an orphan
    store.update_task(pt.id, paused_running=0)
    assert [t.name for t in store.orphaned_tasks(NOW + 100, 30.0)] == ["stale", "stopped", "ghost"]


def test_take_over(store: Any) -> None:
    (a,) = store.add_tasks([spec("a")], NOW)
    claim(store, "old")  # lease until NOW + 60
    # reclaim needs the lease expired
    assert store.take_over(a.id, "old", 1, "new", "h2", NOW + 30, 60.0, require_lease_expired=True) is None
    assert store.take_over(a.id, "other", 1, "new", "h2", NOW + 90, 60.0, require_lease_expired=True) is None
    assert store.take_over(a.id, "old", 2, "new", "h2", NOW + 90, 60.0, require_lease_expired=True) is None
    t = store.take_over(a.id, "old", 1, "new", "h2", NOW + 90, 60.0, require_lease_expired=True)
    assert (t.owner, t.host, t.lease_until, t.status, t.attempt) == ("new", "h2", NOW + 150, R, 1)
    # adoption of a live shim does not wait for the lease
    t2 = store.take_over(a.id, "new", 1, "third", "h3", NOW + 91, 60.0, require_lease_expired=False)
    assert t2.owner == "third"
    last = store.transitions(a.id)[-2:]
    assert [(x.src, x.dst, x.reason, x.actor) for x in last] == [
        ("running", "running", "adopted from old", "new"),
        ("running", "running", "adopted from new", "third"),
    ]
    # a task without owner (None) can be taken over only as None
    (b,) = store.add_tasks([spec("b")], NOW)
    assert store.take_over(b.id, None, 0, "x", "h", NOW, 60.0, require_lease_expired=True).owner == "x"


# -- attempts --------------------------------------------------------------------------------------
def test_attempts(store: Any) -> None:
    (a,) = store.add_tasks([spec("a")], NOW)
    store.put_attempt(Attempt(task_id=a.id, n=2, owner="e1", dir="/d/2", started_at=NOW + 2, cost_usd=0.5))
    store.put_attempt(Attempt(task_id=a.id, n=1, owner="e1", dir="/d/1", started_at=NOW, prompt="hi"))
    store.update_attempt(a.id, 1, shim_pid=42, shim_create_time=7.5, outcome="success", exit_code=0)
    store.update_attempt(a.id, 1)
    at = store.get_attempt(a.id, 1)
    assert (at.shim_pid, at.shim_create_time, at.outcome, at.exit_code, at.prompt) == (
        42,
        7.5,
        "success",
        0,
        "hi",
    )
    assert store.get_attempt(a.id, 3) is None
    assert [x.n for x in store.attempts(a.id)] == [1, 2]
    store.put_attempt(Attempt(task_id=a.id, n=2, owner="e2", dir="/d/2b", started_at=NOW + 3))
    assert store.get_attempt(a.id, 2).owner == "e2" and store.get_attempt(a.id, 2).cost_usd == 0.0


def test_start_attempt_records_the_attempt_and_the_workdir_of_its_claim(store: Any) -> None:
    store.add_tasks([spec("a")], NOW)
    t = claim(store, "e1")
    store.start_attempt(
        Attempt(task_id=t.id, n=1, owner="e1", dir="/d/1", started_at=NOW, prompt="hi", shim_pid=42), "/w"
    )
    at = store.get_attempt(t.id, 1)
    assert (at.owner, at.dir, at.prompt, at.shim_pid) == ("e1", "/d/1", "hi", 42)
    assert store.get_task(t.id).workdir == "/w"
    # an engine that lost the claim still records what it started, but not the task's workdir
    store.start_attempt(Attempt(task_id=t.id, n=1, owner="e2", dir="/d/1b", started_at=NOW), "/elsewhere")
    assert store.get_attempt(t.id, 1).owner == "e2"
    assert store.get_task(t.id).workdir == "/w"


def test_a_move_through_a_state_writes_both_steps_and_the_attempt_record_together(store: Any) -> None:
    store.add_tasks([spec("a")], NOW)
    t = claim(store, "e1")
    store.start_attempt(Attempt(task_id=t.id, n=1, owner="e1", dir="/d/1", started_at=NOW), "/w")
    record = {"ended_at": NOW + 5, "exit_code": 0, "outcome": "success", "cost_usd": 0.5, "tokens": 7}
    # another engine's fence writes nothing: neither the move nor the record
    lost = store.transition(
        t.id, TaskStatus.DONE, reason=None, now=NOW + 5, owner="e2", attempt=1,
        via=TaskStatus.VERIFYING, record=record,
    )  # fmt: skip
    assert lost is None
    assert store.get_task(t.id).status == TaskStatus.RUNNING
    assert store.get_attempt(t.id, 1).outcome is None
    done = store.transition(
        t.id, TaskStatus.DONE, reason="ok", now=NOW + 5, owner="e1", attempt=1,
        via=TaskStatus.VERIFYING, record=record,
    )  # fmt: skip
    assert done is not None and done.status == TaskStatus.DONE
    assert done.owner is None and done.finished_at == NOW + 5  # the entry effects of done
    steps = [(x.src, x.dst, x.reason) for x in store.transitions(t.id)][-2:]
    assert steps == [("running", "verifying", None), ("verifying", "done", "ok")]
    at = store.get_attempt(t.id, 1)
    assert (at.ended_at, at.exit_code, at.outcome, at.cost_usd, at.tokens) == (NOW + 5, 0, "success", 0.5, 7)


def test_a_move_through_a_state_is_checked_step_by_step(store: Any) -> None:
    store.add_tasks([spec("a")], NOW)
    t = claim(store, "e1")
    with pytest.raises(IllegalTransition):  # running -> paused is allowed, paused -> verifying is not
        store.transition(
            t.id, TaskStatus.VERIFYING, reason=None, now=NOW, owner="e1", attempt=1, via=TaskStatus.PAUSED
        )
    assert store.get_task(t.id).status == TaskStatus.RUNNING
    with pytest.raises(ValueError):  # a record needs the claim's fence
        store.transition(t.id, TaskStatus.DONE, reason=None, now=NOW, record={"exit_code": 0})
    with pytest.raises(ValueError):  # and only the attempt's own columns
        store.transition(
            t.id, TaskStatus.DONE, reason=None, now=NOW, owner="e1", attempt=1, record={"status": "x"}
        )
    assert store.get_task(t.id).status == TaskStatus.RUNNING


def test_spent_since(store: Any) -> None:
    (a,) = store.add_tasks([spec("a")], NOW)
    assert store.spent_since(0) == 0.0
    for n, (start, cost) in enumerate([(NOW - 100, 1.0), (NOW, 0.25), (NOW + 10, 0.5)], 1):
        store.put_attempt(Attempt(task_id=a.id, n=n, owner="e", dir="/", started_at=start, cost_usd=cost))
    assert store.spent_since(NOW) == pytest.approx(0.75)
    assert store.spent_since(0) == pytest.approx(1.75)


# -- events ----------------------------------------------------------------------------------------
def ev(tid: str, attempt: int, seq: int, **kw: Any) -> Event:
    kw.setdefault("kind", "text")
    return Event(task_id=tid, attempt=attempt, seq=seq, ts=NOW + seq, **kw)


def test_events_idempotent_with_offset(store: Any) -> None:
    (a,) = store.add_tasks([spec("a")], NOW)
    store.put_attempt(Attempt(task_id=a.id, n=1, owner="e1", dir="/d", started_at=NOW))
    rich = ev(
        a.id,
        1,
        2,
        kind="tool_call",
        tool="Bash",
        tool_input={"cmd": "ls"},
        tool_id="x1",
        usage=Usage(input_tokens=3, output_tokens=4),
        rate_limit=RateLimit("claude", "allowed"),
        is_error=True,
        cost_usd=0.01,
    )
    batch = [ev(a.id, 1, 0, text="hello"), ev(a.id, 1, 1, text="wörld"), rich]
    store.append_events(batch, offset=(a.id, 1, 120))
    store.append_events(batch[1:], offset=(a.id, 1, 150))  # a replay after a crash: no duplicates
    got = store.events(a.id)
    assert [e.seq for e in got] == [0, 1, 2] and got[1].text == "wörld"
    assert got[2] == rich
    at = store.get_attempt(a.id, 1)
    assert (at.stdout_offset, at.next_seq) == (150, 3)
    store.append_events([], offset=(a.id, 1, 160))
    assert (store.get_attempt(a.id, 1).stdout_offset, store.get_attempt(a.id, 1).next_seq) == (160, 3)
    store.append_events([ev(a.id, 2, 0), ev(a.id, 2, 1), ev(a.id, 2, 2, kind="result", text="ok")])
    assert [(e.attempt, e.seq) for e in store.events(a.id, after=(1, 1))] == [(1, 2), (2, 0), (2, 1), (2, 2)]
    assert [(e.attempt, e.seq) for e in store.events(a.id, attempt=2, after=(2, 0))] == [(2, 1), (2, 2)]
    assert [(e.attempt, e.seq) for e in store.events(a.id, limit=2)] == [(1, 0), (1, 1)]
    assert [(e.attempt, e.seq) for e in store.last_events(a.id, 2)] == [(2, 1), (2, 2)]
    assert [(e.attempt, e.seq) for e in store.last_events(a.id, 100)][:2] == [(1, 0), (1, 1)]
    assert store.events("t-other") == [] and store.last_events("t-other", 5) == []


# -- questions -------------------------------------------------------------------------------------
def test_questions(store: Any) -> None:
    a, b = store.add_tasks([spec("a"), spec("b")], NOW)
    q1 = store.add_question(a.id, 1, "which db?", ["pg", "sqlite"], NOW)
    q2 = store.add_question(a.id, 1, "sure?", [], NOW + 1)
    q3 = store.add_question(b.id, 1, "go?", [], NOW + 2)
    assert (q1.status, q1.options, q1.text, q1.asked_at) == ("pending", ("pg", "sqlite"), "which db?", NOW)
    assert store.get_question(q1.id) == q1 and store.get_question("q-none") is None
    assert store.get_task(a.id).asking is True
    assert [q.id for q in store.pending_questions()] == [q1.id, q2.id, q3.id]
    assert store.answer_question(q1.id, "pg", "alice", NOW + 5) is True
    assert store.answer_question(q1.id, "sqlite", "bob", NOW + 6) is False
    got = store.get_question(q1.id)
    assert (got.status, got.answer, got.answered_by, got.answered_at) == ("answered", "pg", "alice", NOW + 5)
    assert store.expire_question(q3.id, NOW + 7) is True and store.expire_question(q3.id, NOW + 8) is False
    assert store.close_questions(a.id, "cancelled", NOW + 9) == 1
    assert store.close_questions(a.id, "cancelled", NOW + 9) == 0
    assert [q.status for q in store.questions(a.id)] == ["answered", "cancelled"]
    assert store.pending_questions() == [] and store.get_task(a.id).asking is False


def test_first_answer_wins_across_connections(make_store: MakeStore) -> None:
    s0 = make_store()
    (a,) = s0.add_tasks([spec("a")], NOW)
    stores = [make_store() for _ in range(2)]
    for rnd in range(10):
        q = s0.add_question(a.id, 1, f"q{rnd}", [], NOW)
        barrier = threading.Barrier(2)
        results: list[bool] = []

        def answer(
            s: Any, who: str, q: Any = q, barrier: threading.Barrier = barrier, results: list[bool] = results
        ) -> None:
            barrier.wait()
            results.append(s.answer_question(q.id, who, who, NOW))

        threads = [threading.Thread(target=answer, args=(s, f"u{i}")) for i, s in enumerate(stores)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == [False, True]
        got = s0.get_question(q.id)
        assert got.status == "answered" and got.answer == got.answered_by


# -- hosts, settings, rate limits, commands -------------------------------------------------------
def test_hosts_settings_rate_limits(store: Any) -> None:
    store.upsert_host(
        Host(
            "b",
            NOW,
            cores=8,
            load=1.5,
            mem_available=2**33,
            disk_free=2**40,
            running=2,
            tags=("gpu", "linux"),
            version="0.1.0",
        )
    )
    store.upsert_host(Host("a", NOW, tags=()))
    store.upsert_host(Host("b", NOW + 5, cores=8, running=3, tags=("gpu",)))
    hs = store.hosts()
    assert [h.name for h in hs] == ["a", "b"]
    assert hs[1] == Host("b", NOW + 5, cores=8, running=3, tags=("gpu",))
    assert hs[0].tags == ()
    assert store.get_setting("paused") is None
    store.set_setting("paused", "1")
    store.set_setting("paused", "0")
    assert store.get_setting("paused") == "0"
    store.set_setting("paused", None)
    assert store.get_setting("paused") is None
    for key in ("series:a:1:x", "series:b", "series;", "series", "seriez:a", "Series:a", "series:%"):
        store.set_setting(key, key.upper())
    assert store.settings_with_prefix("series:") == {
        "series:a:1:x": "SERIES:A:1:X",
        "series:b": "SERIES:B",
        "series:%": "SERIES:%",
    }
    assert store.settings_with_prefix("series:%") == {"series:%": "SERIES:%"}  # no wildcard
    assert store.settings_with_prefix("nothing") == {}
    rl = RateLimit("claude", "rejected", 0.99, NOW + 600, "five_hour", NOW)
    store.put_rate_limit(rl, NOW + 600)
    store.put_rate_limit(RateLimit("codex", observed_at=NOW), None)
    assert store.rate_limits() == [(rl, NOW + 600), (RateLimit("codex", observed_at=NOW), None)]
    store.put_rate_limit(RateLimit("claude", "allowed", 0.1, None, None, NOW + 1), None)
    assert store.rate_limits()[0] == (RateLimit("claude", "allowed", 0.1, None, None, NOW + 1), None)


def test_commands_lifecycle(store: Any) -> None:
    (a,) = store.add_tasks([spec("a")], NOW)
    c1 = store.add_command(a.id, "kill", None, "e1", NOW)
    c2 = store.add_command(None, "pause", "all", "e1", NOW + 1)
    c3 = store.add_command(a.id, "merge", None, "e2", NOW + 2)
    assert c1 < c2 < c3
    assert [(c.id, c.verb, c.arg, c.task_id) for c in store.pending_commands("e1")] == [
        (c1, "kill", None, a.id),
        (c2, "pause", "all", None),
    ]
    store.finish_command(c1, "done", "killed")
    assert [c.id for c in store.pending_commands("e1")] == [c2]
    got = store.get_command(c1)
    assert (got.status, got.result, got.created_at, got.target_owner) == ("done", "killed", NOW, "e1")
    store.finish_command(c3, "failed", "no such task")
    assert store.pending_commands("e2") == [] and store.get_command(9999) is None


# -- cross-connection ------------------------------------------------------------------------------
def test_change_marker_moves_after_another_connection_writes(make_store: MakeStore) -> None:
    watcher, writer = make_store(), make_store()
    for write in (lambda: writer.set_setting("k", "v"), lambda: writer.add_tasks([spec("a")], NOW)):
        before = watcher.change_marker()
        write()
        deadline = time.monotonic() + 20
        while watcher.change_marker() == before:
            assert time.monotonic() < deadline, "change_marker did not move after another connection wrote"
            time.sleep(0.01)
    assert watcher.get_task("a") is not None


def test_the_change_token_wakes_a_waiter_when_another_connection_commits(make_store: MakeStore) -> None:
    watcher, writer = make_store(), make_store()
    t0 = watcher.change_token()
    watcher.set_setting("own", "write")
    assert watcher.wait_for_change(t0, 0.3) == t0  # its own commits never move it
    writer.set_setting("k", "v")
    assert watcher.wait_for_change(t0, 20.0) != t0


def test_a_change_calls_back_and_wakes_an_async_waiter_without_a_thread(make_store: MakeStore) -> None:
    watcher, writer = make_store(), make_store()
    calls = threading.Semaphore(0)
    off = watcher.on_change(calls.release)
    t0 = watcher.change_token()
    writer.set_setting("k", "v")
    assert calls.acquire(timeout=20.0), "no call back after another connection's commit"
    assert watcher.change_token() != t0
    off()

    def blocking_wait(token: int, timeout: float) -> int:  # what an async waiter must not need
        raise AssertionError("an async waiter took a thread to wait for a change")

    watcher.wait_for_change = blocking_wait

    async def waits() -> tuple[int, int]:
        token = watcher.change_token()
        quiet = await changed(watcher, token, 0.2)  # nothing changes: the timeout
        async with anyio.create_task_group() as tg:
            got: list[int] = []

            async def wait() -> None:
                got.append(await changed(watcher, token, 30.0))

            tg.start_soon(wait)
            await anyio.sleep(0.05)
            writer.set_setting("k", "w")
        return quiet - token, got[0] - token

    stayed, moved = anyio.run(waits)
    assert stayed == 0
    assert moved != 0


def test_planning_reads_dependencies_in_one_batch_and_stamps_what_moved(make_store: MakeStore) -> None:
    s = make_store()
    a, b, c = s.add_tasks([spec("a"), spec("b", depends_on=("a",)), spec("c", depends_on=("a", "b"))], NOW)
    assert s.unfinished_dependencies() == {b.id: ["a"], c.id: ["a", "b"]}
    stamps = s.queued_stamps()
    assert set(stamps) == {a.id, b.id, c.id}
    got = claim(s)
    assert got is not None and got.id == a.id
    assert set(s.queued_stamps()) == {b.id, c.id} and s.queued_stamps()[b.id] == stamps[b.id]
    s.transition(a.id, TaskStatus.DONE, reason="ok", now=NOW + 1, owner="e1", attempt=got.attempt)
    assert s.unfinished_dependencies() == {c.id: ["b"]}
    s.update_spec(b.id, TaskSpec(name="b", prompt="edited", depends_on=("a",), priority=5), NOW + 2)
    assert s.queued_stamps()[b.id] != stamps[b.id]


def test_unfinished_dependencies_touching_covers_tasks_and_dependents(
    make_store: MakeStore,
) -> None:
    s = make_store()
    a, b, c, d = s.add_tasks(
        [spec("a"), spec("b", depends_on=("a",)), spec("c", depends_on=("a", "b")), spec("d")], NOW
    )
    # a change to ``a`` can release or hold ``a`` itself and everything that depends on it
    assert s.unfinished_dependencies([a.id]) == {a.id: [], b.id: ["a"], c.id: ["a", "b"]}
    assert s.unfinished_dependencies([d.id]) == {d.id: []}
    assert s.unfinished_dependencies([]) == {}
    got = claim(s)
    assert got is not None and got.id == a.id
    s.transition(a.id, TaskStatus.DONE, reason="ok", now=NOW + 1, owner="e1", attempt=got.attempt)
    # ``a`` left the queue: it has no entry; its dependents are told what still holds them
    assert s.unfinished_dependencies([a.id]) == {b.id: [], c.id: ["b"]}


def test_racing_claims_take_every_task_exactly_once(make_store: MakeStore) -> None:
    first = make_store()
    first.add_tasks([spec(f"t{i:03d}", priority=i % 3) for i in range(200)], NOW)
    stores = [make_store() for _ in range(4)]
    got: list[list[str]] = [[] for _ in stores]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(stores))

    def run(i: int) -> None:
        try:
            barrier.wait()
            while (t := stores[i].claim(f"e{i}", "h", (), NOW, 60.0, "sim", None)) is not None:
                got[i].append(t.id)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    counts = Counter(tid for ids in got for tid in ids)
    assert len(counts) == 200 and set(counts.values()) == {1}
    tasks = first.list_tasks()
    assert all(t.status == R and t.attempt == 1 for t in tasks)
    owner_of = {tid: f"e{i}" for i, ids in enumerate(got) for tid in ids}
    assert all(t.owner == owner_of[t.id] for t in tasks)
    assert all(len(first.transitions(t.id)) == 2 for t in tasks[:20])


def test_sqlite_reads_tasks_whatever_the_order_of_its_columns(tmp_path: Any) -> None:
    """A file migrated from an older version holds its newer columns last; tasks are read by the
    query's own column positions, never by the schema's declared order."""
    import sqlite3

    path = str(tmp_path / "fleet.db")
    store = SqliteStore(path)
    try:
        store.add_tasks([TaskSpec(name="a", prompt="x"), TaskSpec(name="b", prompt="y")], 1.0)
        claimed = store.claim("me", "h", (), 2.0, 60.0, "shell", None)
        assert claimed is not None
        before = store.list_tasks()
    finally:
        store.close()
    db = sqlite3.connect(path)
    info = list(db.execute("PRAGMA table_info(tasks)"))  # (cid, name, type, notnull, default, pk)
    cols = [r[1] for r in info]
    defs = ", ".join(
        f"{name} {kind}"
        + (" NOT NULL" if notnull else "")
        + (f" DEFAULT {default}" if default is not None else "")
        + (" PRIMARY KEY" if pk else "")
        for _, name, kind, notnull, default, pk in reversed(info)
    )
    triggers = list(db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"))
    indexes = [
        r[0]
        for r in db.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'tasks' AND sql IS NOT NULL"
        )
    ]
    db.executescript(
        "PRAGMA foreign_keys = OFF;"
        + "".join(f" DROP TRIGGER {name};" for name, _ in triggers)
        + f" CREATE TABLE tasks_r ({defs});"
        f" INSERT INTO tasks_r ({', '.join(cols)}) SELECT {', '.join(cols)} FROM tasks;"
        " DROP TABLE tasks; ALTER TABLE tasks_r RENAME TO tasks;"
        + "".join(f" {sql};" for sql in indexes)
        + "".join(f" {sql};" for _, sql in triggers)
    )
    assert [r[1] for r in db.execute("PRAGMA table_info(tasks)")] == list(reversed(cols))
    db.close()
    store = SqliteStore(path)
    try:
        assert store.list_tasks() == before
        assert store.get_task("a") == before[0]
    finally:
        store.close()
