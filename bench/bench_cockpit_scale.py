"""The cockpit at scale: a 10,000-task backlog over 20 repositories (most queued, 8 running), against
the same cockpit with 10 tasks and against a bare Textual app, in the same run.

Each configuration runs in a child process of its own (clean CPU and memory figures), headless
at 160x48, and reports:

- start: from creating the app to the first screen that shows the queue;
- idle CPU: this process's CPU time over ``--idle-seconds`` while nothing changes and no key is
  pressed (a share of one core; the 1 s snapshot pull keeps running, as in the cockpit);
- load CPU: the same while 8 agents each send ``--rate`` events/s (an agent event plus a task
  update with new tokens/cost, the way the engine publishes usage), with a running task selected
  so the stream pane follows one of them;
- key to screen, after each CPU phase (``--key-seconds``): ``down``/``up`` posted the way the
  terminal driver posts it, until the screen showing the moved cursor has been refreshed
  (p50/p99, idle and under load);
- memory: the peak RSS of the process.

The cockpit here runs on an in-process fake engine (what the cockpit costs by itself). With
``--engine`` one more configuration hosts the real engine (on its own thread, as ``fleet-tui``
does) on a SQLite store of the same 10,000 tasks with the fleet paused (nothing runs): its idle
CPU is the cockpit plus the engine's own housekeeping, planning and snapshot (the quiet-engine
issue).

Goals (issue 20): start <= 1 s, idle <= 1 % of a core, load <= 25 % of a core, RSS <= 300 MB.
It prints figures and ratios; it asserts nothing.

Usage: python bench/bench_cockpit_scale.py [--tasks 10000] [--repos 20] [--idle-seconds 10]
       [--load-seconds 10] [--rate 20] [--engine]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import unicodedata
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psutil
from textual import events
from textual.app import App, ComposeResult
from textual.widgets import Footer, Static

from fleet_tui.app.app import FleetApp
from fleet_tui.app.hosted import EngineThread
from fleet_tui.scheduler.api import CommandResult
from fleet_tui.scheduler.model import (
    AgentEvent,
    EngineEvent,
    Event,
    Gauges,
    Snapshot,
    Task,
    TaskChanged,
    TaskSpec,
)
from fleet_tui.scheduler.states import TaskStatus as S

SIZE = (160, 48)
NOW = time.time()
REPOS = [f"repo-{k:02d}" for k in range(100)]


def fleet(n: int, repos: int, root: str) -> list[Task]:
    """``n`` tasks over ``repos`` folders: 8 running, 3 parked, ~1 % finished, the rest queued."""
    out = []
    for i in range(n):
        cwd = f"{root}/{REPOS[i % repos]}"
        spec = TaskSpec(name=f"{REPOS[i % repos]}-task-{i:05d}", prompt="x", cwd=cwd, priority=i % 3)
        kw: dict[str, Any] = dict(created_at=NOW - n + i, updated_at=NOW - n + i)
        if i < 8:
            status = S.RUNNING
            kw.update(attempt=1, coder="sim", host="box1", started_at=NOW - 60, attempt_started_at=NOW - 60)
        elif i < 11:
            status = S.NEEDS_HUMAN
            kw.update(reason="retries_exhausted")
        elif i < 11 + n // 100:
            status = S.DONE
            kw.update(started_at=NOW - 900, finished_at=NOW - 800 + i)
        else:
            status = S.QUEUED
            kw.update(waiting="slots full: 8/8 running")
        out.append(Task(id=f"t-{i:05d}", spec=spec, status=status, **kw))
    return out


class FakeEngine:
    """The EngineAPI surface the cockpit uses, serving a fixed snapshot and pushed batches."""

    def __init__(self, tasks: list[Task]) -> None:
        self._snap = Snapshot(taken_at=NOW, tasks=tuple(tasks), gauges=Gauges(running=8, max_concurrent=8))
        self.queues: list[asyncio.Queue[list[EngineEvent] | None]] = []

    def snapshot(self) -> Snapshot:
        return self._snap

    async def subscribe(self) -> AsyncIterator[list[EngineEvent]]:
        q: asyncio.Queue[list[EngineEvent] | None] = asyncio.Queue()
        self.queues.append(q)
        while (batch := await q.get()) is not None:
            yield batch

    def push(self, batch: list[EngineEvent]) -> None:
        for q in self.queues:
            q.put_nowait(batch)

    async def events(self, ref: str, attempt: int | None = None, limit: int = 2000) -> list[Event]:
        return []

    async def shutdown(self, leave_running: bool) -> None:
        for q in self.queues:
            q.put_nowait(None)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        async def refused(*args: Any) -> CommandResult:
            return CommandResult(False, f"{name}: not in this benchmark")

        return refused


class Bare(App[None]):
    def compose(self) -> ComposeResult:
        yield Static("a bare Textual app", id="body")
        yield Footer()


def send_key(app: App[Any], key: str) -> None:
    try:
        char: str | None = unicodedata.lookup(key.upper().replace("_", " "))
    except KeyError:
        char = key if len(key) == 1 else None
    event = events.Key(key, char)
    event.set_sender(app)
    assert app._driver is not None
    app._driver.send_message(event)


async def refreshed(app: App[Any]) -> None:
    done = asyncio.Event()
    if app.screen.call_after_refresh(done.set):
        await asyncio.wait_for(done.wait(), 30)


async def key_times(app: App[Any], seconds: float) -> list[float]:
    """Cursor moves at a person's pace (every 0.25 s) for ``seconds``."""
    out: list[float] = []
    if not isinstance(app, FleetApp):
        await asyncio.sleep(seconds)
        return out
    end = time.perf_counter() + seconds
    step = "down"
    while time.perf_counter() < end:
        queue = app.queue
        row = queue.cursor_row
        t0 = time.perf_counter()
        send_key(app, step)
        while queue.cursor_row == row and time.perf_counter() - t0 < 10:
            await asyncio.sleep(0.0005)
        await refreshed(app)
        out.append(time.perf_counter() - t0)
        step = "up" if step == "down" else "down"
        await asyncio.sleep(0.25)
    return out


async def cpu_over(seconds: float) -> float:
    """This process's CPU time over ``seconds`` of wall time, as a share of one core (no keys)."""
    t0, c0 = time.perf_counter(), time.process_time()
    await asyncio.sleep(seconds)
    return (time.process_time() - c0) / (time.perf_counter() - t0)


async def run_one(cfg: dict[str, Any]) -> dict[str, Any]:
    proc = psutil.Process()
    kind, n = cfg["kind"], cfg["tasks"]
    engine: Any = None
    store: Any = None
    tmp = tempfile.TemporaryDirectory(prefix="bench-scale-")
    if kind == "fake":
        engine = FakeEngine(fleet(n, cfg["repos"], "/nonexistent-bench/src"))
    elif kind == "engine":
        from fleet_tui.config import Config
        from fleet_tui.scheduler.engine import Engine
        from fleet_tui.scheduler.store.sqlite_store import SqliteStore

        home = Path(tmp.name)
        store = SqliteStore(str(home / "fleet.db"))
        specs = [TaskSpec(name=t.name, prompt="x", cwd=tmp.name, coder="sim") for t in fleet(n, 1, tmp.name)]
        store.add_tasks(specs, time.time())
        store.set_setting("fleet_paused", "1")
        engine = Engine(store, home, Config(default_coder="sim"))
    t0 = time.perf_counter()
    if kind == "bare":
        app: App[Any] = Bare()
    else:
        if kind == "engine":  # hosted as `fleet-tui` does: on a thread of its own
            engine = EngineThread(engine, engine.run)
        app = FleetApp(engine, on_quit="leave", run_engine=engine.run if kind == "engine" else None)
    result: dict[str, Any] = {"name": cfg["name"]}
    async with app.run_test(size=SIZE) as pilot:
        if isinstance(app, FleetApp):
            while app.queue.row_count == 0 and time.perf_counter() - t0 < 60:
                await asyncio.sleep(0.001)
        await refreshed(app)
        result["start_s"] = time.perf_counter() - t0
        await pilot.pause()
        await asyncio.sleep(1.0)  # past the first pull
        result["idle_cpu"] = await cpu_over(cfg["idle_seconds"])
        result["idle_keys"] = await key_times(app, cfg["key_seconds"])
        if kind == "fake" and isinstance(app, FleetApp):
            app.queue.select_id("t-00000")
            stop = asyncio.Event()
            pusher = asyncio.create_task(push_load(engine, app, cfg["rate"], stop))
            result["load_cpu"] = await cpu_over(cfg["load_seconds"])
            result["load_keys"] = await key_times(app, cfg["key_seconds"])
            stop.set()
            await pusher
        result["rss_mb"] = proc.memory_info().rss / 2**20
        if isinstance(app, FleetApp):
            result["rows"] = app.queue.row_count
            result["lines_drawn"] = app.queue.lines_drawn
        if kind == "engine":
            await engine.shutdown(leave_running=False)
        app.exit()
    if kind == "engine":
        engine.stop()
    if store is not None:
        store.close()
    tmp.cleanup()
    return result


async def push_load(engine: FakeEngine, app: FleetApp, rate: int, stop: asyncio.Event) -> None:
    """8 agents x ``rate`` events/s, delivered in 20 Hz batches like the bus delivers them."""
    running = [t for t in engine.snapshot().tasks if t.status == S.RUNNING]
    seq = 0
    tick = 0.05
    per = max(1, round(rate * tick))
    tokens = {t.id: 0 for t in running}
    while not stop.is_set():
        batch: list[EngineEvent] = []
        now = time.time()
        for t in running:
            for _ in range(per):
                seq += 1
                batch.append(AgentEvent(Event(t.id, 1, seq, now, "text", text=f"line {seq}")))
            tokens[t.id] += 100 * per
            task = app.tasks.get(t.id, t)
            batch.append(TaskChanged(_bump(task, tokens[t.id], now)))
        engine.push(batch)
        await asyncio.sleep(tick)


def _bump(task: Task, tokens: int, now: float) -> Task:
    from dataclasses import replace

    return replace(task, tokens=tokens, cost_usd=tokens / 1e6, updated_at=now)


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    by = {r["name"]: r for r in results}
    print(
        f"\ncockpit at scale: {args.tasks} tasks over {args.repos} repositories, 8 running, "
        f"{SIZE[0]}x{SIZE[1]}"
    )
    print(
        f"{'configuration':<26} {'start':>8} {'idle CPU':>9} {'load CPU':>9} {'RSS':>8}   "
        "key p50/p99 idle · load"
    )
    for r in results:
        load = f"{r['load_cpu'] * 100:8.1f}%" if "load_cpu" in r else f"{'-':>9}"
        keys = ""
        if r.get("idle_keys"):
            keys = f"{pct(r['idle_keys'], 50) * 1000:5.1f}/{pct(r['idle_keys'], 99) * 1000:5.1f} ms"
        if r.get("load_keys"):
            keys += f" · {pct(r['load_keys'], 50) * 1000:5.1f}/{pct(r['load_keys'], 99) * 1000:5.1f} ms"
        print(
            f"{r['name']:<26} {r['start_s']:7.2f}s {r['idle_cpu'] * 100:8.2f}% {load} "
            f"{r['rss_mb']:6.0f}MB   {keys}"
        )
    big, small, bare = by["cockpit 10k tasks"], by["cockpit 10 tasks"], by["bare Textual app"]
    print("\nratios (same run)")
    print(
        f"  start      10k / 10 tasks {big['start_s'] / small['start_s']:5.2f}x · "
        f"10k / bare {big['start_s'] / bare['start_s']:5.2f}x"
    )
    print(
        f"  idle CPU   10k / 10 tasks {big['idle_cpu'] / max(small['idle_cpu'], 1e-4):5.2f}x · "
        f"10k / bare {big['idle_cpu'] / max(bare['idle_cpu'], 1e-4):5.2f}x"
    )
    print(f"  load CPU   10k / 10 tasks {big['load_cpu'] / max(small['load_cpu'], 1e-4):5.2f}x")
    print(
        f"  RSS        10k / 10 tasks {big['rss_mb'] / small['rss_mb']:5.2f}x · "
        f"10k / bare {big['rss_mb'] / bare['rss_mb']:5.2f}x"
    )
    print(f"  lines drawn by the queue: 10k {big['lines_drawn']} · 10 tasks {small['lines_drawn']}")
    goals = [
        ("queue shown within 1 s", big["start_s"] <= 1.0),
        ("idle CPU <= 1 % of a core", big["idle_cpu"] <= 0.01),
        ("load CPU <= 25 % of a core", big["load_cpu"] <= 0.25),
        ("RSS <= 300 MB", big["rss_mb"] <= 300),
    ]
    print("\ngoals (issue 20), cockpit 10k tasks on the fake engine:")
    for what, ok in goals:
        print(f"  {'met    ' if ok else 'NOT met'}  {what}")
    if "cockpit + engine 10k idle" in by:
        e = by["cockpit + engine 10k idle"]
        print(
            "\nwith the real engine hosted (SQLite, 10k tasks, fleet paused): "
            f"idle CPU {e['idle_cpu'] * 100:.1f}% ({e['idle_cpu'] / max(big['idle_cpu'], 1e-4):.0f}x "
            f"the cockpit alone), start {e['start_s']:.2f}s, "
            f"RSS {e['rss_mb']:.0f}MB: the difference is the engine's own polling"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--repos", type=int, default=20)
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument("--load-seconds", type=float, default=10.0)
    ap.add_argument("--key-seconds", type=float, default=5.0, help="cursor moves, after each CPU phase")
    ap.add_argument("--rate", type=int, default=20, help="events per second per running agent")
    ap.add_argument("--engine", action="store_true", help="also measure the real engine hosted, idle")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(asyncio.run(run_one(json.loads(args.one)))))
        return
    common = dict(
        idle_seconds=args.idle_seconds,
        load_seconds=args.load_seconds,
        rate=args.rate,
        key_seconds=args.key_seconds,
    )
    configs = [
        dict(name="bare Textual app", kind="bare", tasks=0, repos=1, **common),
        dict(name="cockpit 10 tasks", kind="fake", tasks=10, repos=2, **common),
        dict(name="cockpit 10k tasks", kind="fake", tasks=args.tasks, repos=args.repos, **common),
    ]
    if args.engine:
        configs.append(
            dict(name="cockpit + engine 10k idle", kind="engine", tasks=args.tasks, repos=1, **common)
        )
    results = []
    for cfg in configs:
        print(f"running: {cfg['name']} ...", flush=True)
        out = subprocess.run(
            [sys.executable, __file__, "--one", json.dumps(cfg)], capture_output=True, text=True, check=False
        )
        if out.returncode != 0:
            print(out.stdout[-2000:], out.stderr[-4000:])
            raise SystemExit(f"{cfg['name']} failed")
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    report(results, args)


if __name__ == "__main__":
    main()
