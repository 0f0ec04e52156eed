"""Each running engine's recorded slot cap (scheduler/caps.py): what `plan`, in another process,
counts this machine's agents against."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from fleet_tui.config import Config
from fleet_tui.scheduler import caps
from fleet_tui.scheduler.engine import Engine
from fleet_tui.scheduler.store.sqlite_store import SqliteStore

pytestmark = pytest.mark.timeout(60)


def test_total_sums_the_recorded_caps_and_takes_the_default_for_an_engine_without_one(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "fleet.db"))
    try:
        caps.save(store, "a", 1)
        caps.save(store, "b", 3)
        store.set_setting(caps.SETTING + "c", "many")  # garbled: the default, like no row at all
        assert caps.total(store, ["a", "b"], 4) == 4
        assert caps.total(store, ["a", "c", "old-version"], 4) == 1 + 4 + 4
        assert caps.prune(store, {"a"}) == 2
        assert store.settings_with_prefix(caps.SETTING) == {"cap:a": "1"}
        store.set_setting(caps.key("a"), None)  # its stop
        assert store.settings_with_prefix(caps.SETTING) == {}
    finally:
        store.close()


async def test_an_engine_records_the_cap_it_runs_with_while_it_runs(tmp_path: Path) -> None:
    """Its command line's cap, not the config file's; a cap set while it runs; none once it
    stopped; and a crashed engine's row goes when the next one starts."""
    store = SqliteStore(str(tmp_path / "fleet.db"))
    caps.save(store, "crashed-engine", 7)
    (tmp_path / "config.toml").write_text("max_concurrent = 4\n")
    engine = Engine(store, tmp_path, Config(max_concurrent=2), config_path=tmp_path / "config.toml")
    engine.overrides["max_concurrent"] = 2  # `run --max-concurrent 2`, as cli.py sets it
    mine = caps.SETTING + engine.owner

    async def recorded(value: str | None) -> None:
        with anyio.fail_after(30):
            while store.get_setting(mine) != value:
                await anyio.sleep(0.02)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.run)
            await recorded("2")
            assert store.settings_with_prefix(caps.SETTING) == {mine: "2"}  # the crashed one's went
            # a setting changed from the cockpit keeps the command line's cap over the file's
            assert (await engine.set_config("max_load_per_core", "9")).ok
            assert engine.cfg.max_concurrent == 2
            del engine.overrides["max_concurrent"]
            assert (await engine.set_config("max_concurrent", "3")).ok
            await recorded("3")
            await engine.shutdown(leave_running=False)
        assert store.get_setting(mine) is None
    finally:
        store.close()


async def test_an_engine_back_from_a_long_silence_records_its_cap_again(tmp_path: Path) -> None:
    """Silent past the staleness window (a suspended laptop), an engine counts as gone: one that
    starts meanwhile drops its cap. Its next heartbeat writes it again."""
    store = SqliteStore(str(tmp_path / "fleet.db"))
    try:
        engine = Engine(store, tmp_path, Config(max_concurrent=3))
        store.register_engine(engine.owner, engine.host, 1, 0.0, time.time())
        await anyio.to_thread.run_sync(engine._start_records)
        mine = caps.SETTING + engine.owner
        await engine._heartbeat()
        assert store.get_setting(mine) == "3"
        caps.prune(store, set())  # another engine started while this one was silent
        await engine._heartbeat()  # a heartbeat on time: nothing written
        assert store.get_setting(mine) is None
        engine._hb_ok_at = time.time() - 60  # the last one a minute ago
        await engine._heartbeat()
        assert store.get_setting(mine) == "3"
    finally:
        store.close()
