"""``Store.update_spec`` (``fleet-tui edit``) on both stores, and the follow-up's turn-boundary watch.

Why: an edit is written by the CLI while an engine in another process holds its own store object
(which caches parsed specs): the engine must see the new spec at its next read, only a queued
task may change, and a changed coder or model is resolved again at the next claim.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tests.engine.test_store_contract import MakeStore, make_store, store  # noqa: F401

from fleet_tui.scheduler.humans.followup import TurnStop, open_calls
from fleet_tui.scheduler.model import Event, TaskSpec
from fleet_tui.scheduler.states import TaskStatus

NOW = 1_000.0


def test_update_spec_is_seen_by_another_store_object(make_store: MakeStore) -> None:  # noqa: F811
    writer, reader = make_store(), make_store()
    [t] = writer.add_tasks([TaskSpec(name="job", prompt="old words", priority=1)], NOW)
    assert reader.get_task(t.id).spec.prompt == "old words"  # parsed and cached by the reader
    new = replace(t.spec, prompt="new words", priority=9, coder="sim")
    updated = writer.update_spec(t.id, new, NOW + 1)
    assert updated is not None and updated.spec.prompt == "new words"
    seen = reader.get_task(t.id)
    assert seen.spec.prompt == "new words" and seen.spec.priority == 9, seen


def test_update_spec_only_while_queued(store: Any) -> None:  # noqa: F811
    [t] = store.add_tasks([TaskSpec(name="job", prompt="p")], NOW)
    store.transition(t.id, TaskStatus.CANCELLED, reason="x", now=NOW, expect=[TaskStatus.QUEUED])
    assert store.update_spec(t.id, replace(t.spec, prompt="q"), NOW) is None
    assert store.get_task(t.id).spec.prompt == "p"


class FakeRunner:
    def __init__(self) -> None:
        self.stop_reason: str | None = None
        self.stop_detail: str | None = None
        self.open_questions: set[str] = set()

    def stop(self, reason: str, detail: str | None = None) -> None:
        self.stop_reason, self.stop_detail = reason, detail


def ev(seq: int, kind: str, tool_id: str | None = None, tool: str | None = None) -> Event:
    return Event(task_id="t", attempt=1, seq=seq, ts=NOW, kind=kind, tool_id=tool_id, tool=tool)


def test_turn_stop_waits_until_every_open_call_has_its_result() -> None:
    # two parallel calls were open before the follow-up came: the first result is no boundary
    seen = [
        ev(0, "tool_call", "a"),
        ev(1, "tool_call", "b", "Grep"),
        ev(2, "tool_call", "c"),
        ev(3, "tool_result", "c"),
    ]
    assert open_calls(seen) == {"a": "", "b": "Grep"}
    r = FakeRunner()
    watch = TurnStop(NOW + 60, 60, open_calls(seen))
    watch(r, [ev(4, "tool_result", "a", "Bash"), ev(5, "text")], NOW + 1)
    assert r.stop_reason is None
    watch(r, [], NOW + 2)
    assert r.stop_reason is None
    watch(r, [ev(6, "tool_result", "b")], NOW + 3)  # a result without the tool's name
    assert r.stop_reason == "retry_by_user"
    assert r.stop_detail == "follow-up: stopped at a turn boundary (after the result of Grep)"


def test_turn_stop_at_the_result_a_question_or_the_deadline() -> None:
    r = FakeRunner()
    TurnStop(NOW + 60, 60, {"a": "Bash"})(r, [ev(0, "result")], NOW)
    assert r.stop_detail == "follow-up: stopped at a turn boundary (at its final result)"
    r = FakeRunner()
    r.open_questions = {"q"}
    TurnStop(NOW + 60, 60, {})(r, [], NOW)
    assert r.stop_detail == "follow-up: stopped while it waited for a person's answer"
    r = FakeRunner()
    watch = TurnStop(NOW + 5, 5, {"a": "Bash"})
    watch(r, [ev(0, "tool_call", "b")], NOW + 4.9)
    assert r.stop_reason is None
    watch(r, [], NOW + 5)
    assert r.stop_detail == "follow-up: no turn boundary within 5 s (followup_grace_s); stopped anyway"
