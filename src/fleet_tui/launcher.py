"""Starting the cockpit: the engine inside the app (``fleet-tui``), an attached view
(``fleet-tui --attach``), or the demo on a fresh temporary home (``fleet-tui demo``).

This is the only module that puts the engine and the Textual app together; the engine itself never
imports Textual.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

DEMO_TASKS = r"""
# The demo fleet: every task runs the built-in simulated agent (coder "sim").
[defaults]
coder = "sim"
max_retries = 2

[[task]]
name = "scaffold"
priority = 10
prompt = '''Create the project skeleton.
@sim steps=6 pace=0.7
@sim write=README.md text="# demo project\n"
'''
  [[task.verify]]
  run = "test -f README.md"

[[task]]
name = "user-schema"
depends_on = ["scaffold"]
prompt = '''Add a users table migration with email and created_at.
@sim steps=6 pace=0.8
@sim write=schema.sql text="create table users (email text, created_at timestamp);\n"
'''

[[task]]
name = "docs-pass"
priority = 5
prompt = '''Add license headers to the docs.
@sim steps=2 pace=0.6
@sim ask="Which license header should new files carry?" options=MIT,Apache-2.0
@sim steps=3 pace=0.6
@sim write=LICENSE-NOTE.md text="License header chosen by a person.\n"
'''

[[task]]
name = "flaky-tests"
priority = 4
prompt = '''Make the test suite pass.
@sim steps=4 pace=0.6
@sim append=attempts.log text="attempt\n"
'''
  [[task.verify]]
  run = "test $(wc -l < attempts.log) -ge 2"

[[task]]
name = "api-client"
priority = 3
model = "sim-b"    # the sim coder treats each model as its own rate-limit account
prompt = '''Generate the API client.
@sim:1 steps=2 pace=0.5
@sim:1 rate-limit=40
@sim:2+ steps=4 pace=0.6
@sim:2+ write=client.py text="# generated client\n"
'''

[[task]]
name = "search-index"
depends_on = ["user-schema"]
prompt = '''Build the search index over users.
@sim steps=5 pace=0.8
'''

[[task]]
name = "long-refactor"
priority = 1
prompt = '''Refactor the storage layer (a long job).
@sim steps=200 pace=1.5 context=150000
'''
"""

DEMO_CONFIG = """# demo home: short retry backoff so the retry is visible quickly
default_coder = "sim"
max_concurrent = 4
retry_backoff_s = [3.0]
max_load_per_core = 50.0
mem_floor_gib = 0.2
disk_floor_gib = 0.2
"""


def seed_demo(home: Path) -> Path:
    """Write the demo config and tasks into ``home`` and queue them; returns the tasks file."""
    import time

    from fleet_tui.coders.base import coder_names
    from fleet_tui.scheduler.store.opener import open_store
    from fleet_tui.taskfile import load_taskfile

    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(DEMO_CONFIG)
    work = home / "project"
    work.mkdir(exist_ok=True)
    tasks = work / "tasks.toml"
    tasks.write_text(DEMO_TASKS)
    res = load_taskfile(tasks, known_coders=coder_names())
    if not res.ok:  # a bug in the demo itself
        raise RuntimeError("demo tasks do not validate:\n" + "\n".join(map(str, res.errors)))
    store = open_store(None, str(home))
    store.add_tasks(list(res.specs), time.time())
    store.close()
    return tasks


def _app(
    engine: Any, *, title: str, on_quit: str, run_engine: Any, base_dir: str, adoptable: bool = True
) -> Any:
    from fleet_tui.app.app import FleetApp

    return FleetApp(
        engine,
        title=title,
        on_quit=on_quit,  # type: ignore[arg-type]
        run_engine=run_engine,
        base_dir=base_dir,
        hangup=True,  # the terminal going away closes it as ``q`` does (FleetApp._on_hangup)
        adoptable=adoptable,
    )


def stored_reads(store: Any) -> Any | None:
    """A ``Controller`` on a read-only connection of its own to a SQLite ``store``, for what the
    cockpit reads from it on demand (a task's stored events, attempts and history), or None (a
    PostgreSQL store: its connections come from a pool already).

    The store's own connection is the engine's, behind one lock, which the engine's event writes
    hold while 32 loud agents stream: a stream pane's fill waited up to 280 ms for it. WAL lets a
    reader go alongside the writer, so on a connection of its own the fill waits for no write.
    None too when that connection cannot be opened (the reads then share the engine's), or when
    the store has no WAL index beside it yet: a read-only connection that cannot make one reads
    the file as immutable, which would not see the engine's writes."""
    from fleet_tui.scheduler.control import Controller
    from fleet_tui.scheduler.store.protocol import StoreError
    from fleet_tui.scheduler.store.sqlite_store import SqliteStore

    if not isinstance(store, SqliteStore) or not os.path.exists(store.path + "-shm"):
        return None
    try:
        return Controller(SqliteStore(store.path, readonly=True), actor="cockpit")
    except StoreError:
        return None


def run_cockpit(ctx: Any, *, attach: bool = False, title: str = "fleet-tui", adoptable: bool = True) -> int:
    """The cockpit on ``ctx``'s home and store (engine inside unless ``attach``); ``adoptable``:
    a later engine can reach the home, so a hangup may leave its agents running for it."""
    if not sys.stdout.isatty() and not os.environ.get("FLEET_FORCE_TUI"):
        print(
            "fleet-tui: the cockpit needs a terminal; use `fleet-tui run` for a headless engine, "
            "`fleet-tui status` to look",
            file=sys.stderr,
        )
        return 1
    from fleet_tui.app.hosted import EngineThread, engine_nice

    cfg = ctx.cfg
    store = ctx.store
    reads = stored_reads(store)
    if attach:
        from fleet_tui.scheduler.view import AttachedView

        view = AttachedView(store, ctx.home, cfg)
        # store reads off the cockpit's loop, the thread niced below the cockpit's (issue 14)
        hosted = EngineThread(view, view.run, reads=reads, nice=engine_nice(cfg.agent_nice))
        app = _app(
            hosted, title=f"{title} (attached)", on_quit="leave", run_engine=hosted.run, base_dir=os.getcwd()
        )
    else:
        from fleet_tui.scheduler.engine import Engine

        engine = Engine(store, ctx.home, cfg, config_path=ctx.config_path)
        # the engine on a thread of its own, niced below the cockpit's (issue 14)
        hosted = EngineThread(engine, engine.run, reads=reads, nice=engine_nice(cfg.agent_nice))
        app = _app(
            hosted,
            title=title,
            on_quit=cfg.on_quit,
            run_engine=hosted.run,
            base_dir=os.getcwd(),
            adoptable=adoptable,
        )
        _terminal_notifications(engine, app)
    try:
        app.run()
    finally:
        hosted.stop()
        if reads is not None:
            reads.store.close()
    return 0


def _terminal_notifications(engine: Any, app: Any) -> None:
    """Terminal notifications (bell, OSC 9/777) go out through the cockpit's own writer thread, so
    they never land in the middle of a screen update."""
    from fleet_tui import notify

    def write(data: str) -> None:
        driver = app._driver
        if driver is None:
            raise RuntimeError("the cockpit has no terminal right now")
        driver.write(data)

    notify.use_terminal(engine, write)


def run_demo(ctx: Any) -> int:
    """The cockpit on a fresh home seeded with the demo tasks: a new temporary folder, or the
    ``--home`` given on the command line when it is empty (so scripts can look at the store)."""
    given = getattr(ctx.args, "home", None)
    if given:
        home = Path(given).expanduser().resolve()
        if home.exists() and any(home.iterdir()):
            print(
                f"fleet-tui demo: {home} is not empty; give an empty or new folder (or no --home)",
                file=sys.stderr,
            )
            return 1
    else:
        home = Path(tempfile.mkdtemp(prefix="fleet-demo-"))
    seed_demo(home)
    ctx.home = home
    ctx._cfg = None
    ctx._store = None
    ctx.args.store = None
    os.environ.pop("FLEET_STORE", None)
    print(f"fleet-tui demo: home {home}", file=sys.stderr)
    # a temporary home is never opened again (the next demo makes a new one): a hangup stops its
    # agents rather than leave them for an adopter; a --home given may be opened again
    return run_cockpit(ctx, title="fleet-tui demo", adoptable=bool(given))
