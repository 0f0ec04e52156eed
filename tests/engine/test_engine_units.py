"""Unit tests of the engine's small parts: line splitting, the bus, the shim's JSON, NFS refusal."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import anyio
import pytest

from fleet_tui.scheduler.bus import Bus
from fleet_tui.scheduler.model import EngineEvent, Notice
from fleet_tui.scheduler.procs.runner import LineSplitter
from fleet_tui.scheduler.procs.shim import dump_json
from fleet_tui.scheduler.store.protocol import StoreError, is_nfs
from fleet_tui.scheduler.store.sqlite_store import SqliteStore

pytestmark = pytest.mark.timeout(30)


def test_splitter_handles_chunks_partial_lines_and_the_cap() -> None:
    sp = LineSplitter(cap=10)
    assert sp.feed(b"ab") == []
    assert sp.feed(b"c\nde") == [b"abc"]
    assert sp.pending() == 2
    assert sp.feed(b"f\n") == [b"def"]
    # a line over the cap becomes its size, and is not held in memory
    assert sp.feed(b"0123456789") == []
    assert sp.feed(b"0123456789") == []
    assert len(sp.buf) == 0
    assert sp.feed(b"xy\nok\n") == [22, b"ok"]
    # the last line without a newline is flushed at the end
    assert sp.feed(b"tail") == []
    assert sp.flush() == [b"tail"]
    assert sp.flush() == []


def test_splitter_many_lines_in_one_chunk_and_empty_lines() -> None:
    sp = LineSplitter(cap=1 << 20)
    assert sp.feed(b"a\n\nb\nc") == [b"a", b"", b"b"]
    assert sp.flush() == [b"c"]


def test_bus_batches_and_drops_oldest_for_a_slow_reader() -> None:
    async def main() -> list[list[EngineEvent]]:
        bus = Bus(limit=5)
        got: list[list[EngineEvent]] = []
        it = bus.subscribe().__aiter__()
        first = anyio.Event()

        async def reader() -> None:
            async for batch in it:
                got.append(batch)
                first.set()
                if sum(len(b) for b in got) >= 6:
                    return

        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            await anyio.sleep(0)
            bus.publish([Notice(str(i)) for i in range(12)])
            await first.wait()
        return got

    got = anyio.run(main)
    flat = [e.text for b in got for e in b if isinstance(e, Notice)]
    assert flat[0] is not None and "7 events skipped" in flat[0]
    assert flat[1:] == ["7", "8", "9", "10", "11"]


def test_shim_json_is_json() -> None:
    data: dict[str, object] = {"a": 1, "b": None, "c": 'x"y\\z\n\x01', "d": 1.5, "e": True, "f": False}
    assert json.loads(dump_json(data)) == data


def test_nfs_home_is_detected_and_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\nserver:/x {tmp_path}/nfs nfs4 rw 0 0\n")
    (tmp_path / "nfs").mkdir()
    assert is_nfs(str(tmp_path / "nfs" / "home"), str(mounts))
    assert not is_nfs(str(tmp_path / "local"), str(mounts))
    import fleet_tui.scheduler.store.sqlite_base as ss

    monkeypatch.setattr(ss, "is_nfs", lambda p: True)
    with pytest.raises(StoreError, match="network filesystem"):
        SqliteStore(str(tmp_path / "nfs" / "fleet.db"))


def test_wal_is_checkpointed(tmp_path: Path) -> None:
    from fleet_tui.scheduler.model import TaskSpec

    st = SqliteStore(str(tmp_path / "fleet.db"))
    st.add_tasks([TaskSpec(name=f"t{i}", prompt="x" * 2000) for i in range(300)], 0.0)
    wal = tmp_path / "fleet.db-wal"
    assert wal.stat().st_size > 0
    st.maintenance()
    assert wal.stat().st_size == 0


def test_schema_version_newer_than_known_is_refused(tmp_path: Path) -> None:
    SqliteStore(str(tmp_path / "fleet.db")).close()
    with closing(sqlite3.connect(tmp_path / "fleet.db")) as db, db:  # a newer fleet-tui wrote it
        db.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="upgrade fleet-tui"):
        SqliteStore(str(tmp_path / "fleet.db"))


def test_a_full_disk_is_named_with_its_fix_and_loses_nothing(tmp_path: Path) -> None:
    """SQLite's "database or disk is full" (here: the file may not grow) becomes one message that
    names the file and the fix, right for a command and for an engine that waits for room alike;
    the write rolled back whole and what was recorded stays."""
    from fleet_tui.scheduler.model import TaskSpec

    path = tmp_path / "fleet.db"
    with closing(SqliteStore(str(path))) as store:
        store.add_tasks([TaskSpec(name="kept", prompt="x")], 1.0)
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(StoreError) as err:
            store.add_tasks([TaskSpec(name=f"t{i}", prompt="x" * 5000) for i in range(50)], 2.0)
        assert str(err.value) == (
            f"disk full while writing {path}: free some space on that disk (the write rolled back; "
            "nothing already recorded was lost)"
        )
        assert [t.spec.name for t in store.list_tasks()] == ["kept"]


def test_an_agents_inherited_environment_follows_every_change_to_the_engines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``inherited_env`` (decoded once, kept while the environment stays as it was) is always
    ``dict(os.environ)``: a variable set, changed or removed in between is seen, and the copy
    handed out is the caller's to change."""
    import os

    from fleet_tui.scheduler.attempts.launch import inherited_env

    assert inherited_env() == dict(os.environ)
    mine = inherited_env()
    mine["FLEET_T_MINE"] = "x"  # the caller's copy: not the kept one
    assert "FLEET_T_MINE" not in inherited_env()
    monkeypatch.setenv("FLEET_T_NEW", "1")
    assert inherited_env()["FLEET_T_NEW"] == "1"
    monkeypatch.setenv("FLEET_T_NEW", "2")
    assert inherited_env()["FLEET_T_NEW"] == "2"
    monkeypatch.delenv("FLEET_T_NEW")
    assert "FLEET_T_NEW" not in inherited_env()
    assert inherited_env() == dict(os.environ)
