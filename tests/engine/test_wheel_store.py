"""``Store.update_spec`` (``fleet-tui edit``) on both stores.

Why: an edit is written by the CLI while an engine in another process holds its own store object
(which caches parsed specs): the engine must see the new spec at its next read, only a queued
task may change, and a changed coder or model is resolved again at the next claim.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tests.engine.test_store_contract import MakeStore, make_store, store  # noqa: F401

from fleet_tui.scheduler.model import TaskSpec
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
