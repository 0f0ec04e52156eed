"""The fleet's pulse (scheduler/series.py) and the gauges built on it (fleet_tui/gauges.py):
bucketing, counting only growth, hosts summed, the store round trip, and `status --gauges`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from fleet_tui import gauges
from fleet_tui.scheduler import series
from fleet_tui.scheduler.model import Gauges, HostSeries, RateLimit, Snapshot
from fleet_tui.scheduler.series import Counters, SeriesCollector
from fleet_tui.scheduler.store.sqlite_store import SqliteStore
from helpers import fleet

T0 = 1_764_000_000.0  # a multiple of 30
GIB = 1 << 30


def test_collector_counts_growth_per_attempt() -> None:
    c = SeriesCollector("box1")
    c.observe(T0, 1, [Counters(("t1", 1), 500, 90_000, 1.0)])  # adopted at start: not this hour's
    c.observe(T0 + 1, 1, [Counters(("t1", 1), 510, 91_000, 1.5)])
    c.observe(T0 + 2, 2, [Counters(("t1", 1), 512, 91_000, 1.5), Counters(("t2", 1), 3, 100, 0.0)])
    c.observe(T0 + 31, 1, [Counters(("t1", 2), 4, 50, 0.25)])  # a new attempt counts from zero
    s = c.series(T0 + 31)
    assert s.start == T0 and s.bucket_s == 30.0
    assert s.running == (2, 1)
    assert s.events == (10 + 2 + 3, 4)
    assert s.tokens == (1_000 + 100, 50)
    assert s.cost == (0.5, 0.25)


def test_window_pads_to_now_and_hosts_sum() -> None:
    a = HostSeries("a", 30.0, T0, (1, 2), (10, 20), (100, 200), (0.1, 0.2))
    b = HostSeries("b", 30.0, T0 + 30, (3,), (5,), (50,), (0.5,))
    w = series.window(a, T0 + 95)  # two empty buckets up to now
    assert w.running == (1, 2, 0, 0) and w.start == T0
    total = series.fleet_total([a, b], T0 + 65)
    assert total is not None
    assert total.running == (1, 5, 0) and total.events == (10, 25, 0)
    old = series.window(a, T0 + 30 * 500)  # an hour later nothing of it is left
    assert len(old.running) == series.KEEP and not any(old.running + old.events)


def test_store_round_trip(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "fleet.db"))
    c = SeriesCollector("box1")
    c.observe(T0, 0, [])
    c.observe(T0 + 1, 1, [Counters(("t", 1), 7, 70, 0.07)])
    c.save(store, T0 + 1)
    got = series.load(store, ["box1", "nobody"], T0 + 2)
    assert [s.host for s in got] == ["box1"] and got[0].events == (7,)
    store.set_setting("series:bad", "{not json")
    assert series.load(store, ["bad"], T0) == []


def test_gauge_states_and_countdown() -> None:
    g = Gauges(
        running=3, max_concurrent=4, load_per_core=2.5, max_load_per_core=2.0, mem_available=3 * GIB,
        mem_floor=2 * GIB, agent_mem=GIB // 2, disk_free=10 * GIB, disk_floor=GIB, budget_usd=None,
        budget_spent_usd=1.25,
        rate_limits=(RateLimit("claude", "rejected", 1.0, T0 + 90, "five_hour", T0),
                     RateLimit("codex", "allowed", 0.8, T0 + 3600, "weekly", T0)),
        rate_holds=(("claude", T0 + 90),),
    )  # fmt: skip
    snap = Snapshot(taken_at=T0, gauges=g)
    rows = {r.key: r for r in gauges.gauges(snap, T0)}
    assert [rows[k].state for k in ("slots", "load", "mem", "disk")] == ["near", "held", "near", "ok"]
    assert rows["rate:claude"].state == "held" and "in 1m30s" in rows["rate:claude"].note
    assert rows["rate:codex"].state == "near" and rows["rate:codex"].value == "80%"
    assert rows["today"].value == "$1.25"
    later = {r.key: r for r in gauges.gauges(snap, T0 + 60)}
    assert "in 30s" in later["rate:claude"].note
    after = {r.key: r for r in gauges.gauges(snap, T0 + 91)}
    assert after["rate:claude"].state == "ok"  # its window reset: back to work


def _newest(values: list[Any], stored: list[Any]) -> bool:
    """Whether ``values`` end with the ``stored`` buckets: the newest ones, or the ones before an
    empty newest bucket when a 30 s bucket began between storing them and the command reading
    them (the test's clock and the command's are the same wall clock, a second or so apart)."""
    n = len(stored)
    return values[-n:] == stored or (values[-n - 1 : -1] == stored and not values[-1])


def test_status_gauges_cli(tmp_path: Path) -> None:
    home = tmp_path / "home"
    fleet(home, "status")  # creates the home and its store
    store = SqliteStore(str(home / "fleet.db"))
    import time

    now = time.time()
    stored = HostSeries(
        "box9", 30.0, (now // 30 - 2) * 30, (1, 2, 2), (30, 60, 90), (3000, 6000, 900), (0, 0.3, 0)
    )
    store.set_setting("series:box9", series.encode(stored))
    from fleet_tui.scheduler.model import Host

    store.upsert_host(
        Host(name="box9", heartbeat=now, cores=2, load=0.1, mem_available=8 * GIB, disk_free=50 * GIB)
    )
    store.close()
    text = fleet(home, "status", "--gauges").stdout
    assert text.splitlines()[0].startswith("slots")
    assert any(line.startswith("events/s") for line in text.splitlines()), text
    data = json.loads(fleet(home, "status", "--gauges", "--json").stdout)
    assert [g["key"] for g in data["gauges"]][:4] == ["slots", "load", "mem", "disk"]
    assert _newest(data["series"]["fleet"]["running"], [1, 2, 2])
    assert _newest(data["series"]["box9"]["events_per_s"], [1.0, 2.0, 3.0])
    assert json.loads(fleet(home, "status", "--json").stdout) == []  # the plain contract is unchanged


def test_an_engines_slots_count_its_own_agents_and_the_other_engines_apart(tmp_path: Path) -> None:
    """Two engines on one store (a `run` on a server and a cockpit, say): each one's slots gauge
    is its own agents against its own cap, the other engine's agents in its note. Counted all
    together, one agent of its own and three of the other's read "4/4 held" while it went on
    starting agents. A view of the whole fleet (`status --gauges`, an attached cockpit) counts
    every agent as before."""
    from fleet_tui.config import Config
    from fleet_tui.scheduler.model import TaskSpec
    from fleet_tui.scheduler.view import build_snapshot

    store = SqliteStore(str(tmp_path / "fleet.db"))
    try:
        store.add_tasks([TaskSpec(name=f"t{i}", prompt="x", cwd=str(tmp_path)) for i in range(5)], T0)
        for owner in ("me", "other", "other", "other"):
            assert store.claim(owner, "h", (), T0, 60.0, "shell", None) is not None
        cfg = Config(max_concurrent=4)
        mine = build_snapshot(store, cfg, T0, owner="me")
        assert (mine.gauges.running, mine.gauges.running_elsewhere) == (1, 3)
        slots = {r.key: r for r in gauges.gauges(mine, T0)}["slots"]
        assert (slots.value, slots.state, slots.note) == ("1/4", "ok", "+3 on other engines")
        assert dict(slots.numbers)["elsewhere"] == 3
        pulse = gauges.pulses(
            replace(mine, series=(HostSeries("h", 30.0, T0 - 30, (4, 4), (0, 0), (0, 0), (0, 0)),)), T0
        )
        assert pulse[0].now == "4"  # the fleet's agents line: every engine's
        whole = build_snapshot(store, cfg, T0)
        assert (whole.gauges.running, whole.gauges.running_elsewhere) == (4, 0)
        slots = {r.key: r for r in gauges.gauges(whole, T0)}["slots"]
        assert (slots.value, slots.state, slots.note) == ("4/4", "held", "")
    finally:
        store.close()


async def test_an_engine_builds_its_snapshot_with_its_own_slots(tmp_path: Path) -> None:
    from fleet_tui.config import Config
    from fleet_tui.scheduler.engine import Engine
    from fleet_tui.scheduler.model import TaskSpec

    store = SqliteStore(str(tmp_path / "fleet.db"))
    try:
        store.add_tasks([TaskSpec(name=f"t{i}", prompt="x", cwd=str(tmp_path)) for i in range(2)], T0)
        engine = Engine(store, tmp_path, Config(max_concurrent=4), host="here")
        assert store.claim("another engine", "h", (), T0, 60.0, "shell", None) is not None
        assert store.claim(engine.owner, "h", (), T0, 60.0, "shell", None) is not None
        engine.generation += 1  # a build is due
        await engine._refresh_snapshot()
        g = engine.snapshot().gauges
        assert (g.running, g.running_elsewhere) == (1, 1)
    finally:
        store.close()
