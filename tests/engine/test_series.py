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
    got = series.load(store, T0 + 2)
    assert [s.host for s in got] == ["box1"] and got[0].events == (7,)
    store.set_setting("series:bad", "{not json")
    assert [s.host for s in series.load(store, T0 + 2)] == ["box1"]  # a bad row is left out
    assert series.load(store, T0 + 2, skip=c.key) == []


def test_two_engines_on_one_host_keep_a_row_each_and_their_host_sums_them(tmp_path: Path) -> None:
    """A cockpit and a headless `run` on one machine each count their own agents. With one row
    per host, whichever saved last was the host's whole pulse: the other's history was lost."""
    store = SqliteStore(str(tmp_path / "fleet.db"))
    try:
        run = SeriesCollector("box1", key="box1:100:aa")
        cockpit = SeriesCollector("box1", key="box1:200:bb")
        elsewhere = SeriesCollector("box2", key="box2:300:cc")
        for c in (run, cockpit, elsewhere):
            c.observe(T0, 0, [])
        run.observe(T0 + 1, 3, [Counters(("r", 1), 30, 300, 0.3)])
        cockpit.observe(T0 + 1, 4, [Counters(("c", 1), 40, 400, 0.4)])
        elsewhere.observe(T0 + 1, 1, [Counters(("e", 1), 5, 50, 0.05)])
        for c in (run, cockpit, elsewhere):
            c.save(store, T0 + 1)
        # a row an older version wrote for its whole host, still within the hour
        store.set_setting("series:box3", series.encode(HostSeries("box3", 30.0, T0, (2,), (6,), (0,), (0,))))
        got = series.by_host(series.load(store, T0 + 2), T0 + 2)
        assert [s.host for s in got] == ["box1", "box2", "box3"]
        assert (got[0].running, got[0].events, got[0].tokens) == ((7,), (70,), (700,))
        assert got[0].cost == (0.7,) or abs(got[0].cost[0] - 0.7) < 1e-9
        assert (got[1].events, got[2].events) == ((5,), (6,))
        total = series.fleet_total(got, T0 + 2)
        assert total is not None and total.running == (10,) and total.events == (81,)
    finally:
        store.close()


def test_an_engine_starting_prunes_the_rows_that_ended_over_an_hour_ago(tmp_path: Path) -> None:
    """Each engine's run leaves a row for the hour after it; without pruning, an engine started
    by cron each minute would leave a row a minute for ever."""
    store = SqliteStore(str(tmp_path / "fleet.db"))
    try:
        hour = series.KEEP * series.BUCKET_S
        old = HostSeries("box1", 30.0, T0 - hour - 60, (1,), (1,), (0,), (0,))  # ended 90 s too early
        recent = HostSeries("box1", 30.0, T0 - hour + 30, (1,), (1,), (0,), (0,))
        store.set_setting("series:box1:1:old", series.encode(old))
        store.set_setting("series:box1:2:recent", series.encode(recent))
        store.set_setting("series:box1:3:garbled", "{")
        store.set_setting("fleet_paused", "1")  # not a series: left alone
        assert series.prune(store, T0) == 2
        assert sorted(store.settings_with_prefix("series:")) == ["series:box1:2:recent"]
        assert store.get_setting("fleet_paused") == "1"
    finally:
        store.close()


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


async def test_an_engines_pulse_adds_the_other_engines_on_its_host(tmp_path: Path) -> None:
    """Its own series is fresher than its stored row: it reads the other engines' rows and adds
    its own, on a whole build and on the quick ones between (no store read)."""
    import time

    from fleet_tui.config import Config
    from fleet_tui.scheduler.engine import Engine

    store = SqliteStore(str(tmp_path / "fleet.db"))
    try:
        engine = Engine(store, tmp_path, Config(max_concurrent=4), host="here")
        now = time.time()
        start = now // 30 * 30
        other = HostSeries("here", 30.0, start, (3,), (300,), (0,), (0,))
        store.set_setting("series:here:1:other", series.encode(other))
        store.set_setting(
            engine.series.key, series.encode(HostSeries("here", 30.0, start, (9,), (9,), (0,), (0,)))
        )
        engine.series.observe(now, 0, [])
        engine.series.observe(now, 2, [Counters(("t", 1), 20, 0, 0.0)])  # its own, not yet saved
        engine.generation += 1  # a whole build
        await engine._refresh_snapshot()
        (here,) = engine.snapshot().series
        assert here.host == "here" and here.running[-1] == 3 + 2 and here.events[-1] == 300 + 20
        # the other engine's row changes, but a quick build (nothing changed here) reads no store
        store.set_setting("series:here:1:other", series.encode(replace(other, events=(999,))))
        engine.series.observe(now, 1, [Counters(("t", 2), 7, 0, 0.0)])
        generation = engine._snap_generation
        await engine._refresh_snapshot()
        assert engine._snap_generation == generation  # it was a quick one
        (here,) = engine.snapshot().series
        own = engine.series.series(now)
        assert own.events[-1] == 20 + 7 and here.events[-1] == 300 + own.events[-1]
    finally:
        store.close()
