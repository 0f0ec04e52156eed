"""The cockpit driven the way its users run it: `fleet-tui demo` inside real tmux, keys sent with
``send-keys``, the screen read with ``capture-pane``, the outcome read from the store by another
process (``status --json``, ``questions --json``, ``logs --json``).

The Pilot tests in tests/app/ drive FleetApp in-process with a fake engine; only this file checks
that a real terminal (tmux, TERM=xterm-256color, 120x36 and 80x24) shows the panes and that the
keys a person types reach the real engine: answer a question, kill a running task after
confirming, and quit with "stop all" leaving no agent process of the home behind.

Every wait is on a condition (the screen or the store), never a bare sleep. The tmux server has
its own socket and config (status line off, panes kept after their process exits so the exit
status can be read) and is killed at the end whatever happens; any process still working in the
home is killed then too, so a failing run leaks nothing. The cockpit's stderr is never redirected
(Textual draws the screen there).

Marked ``tmux``. Skipped when tmux is missing, except under ``CI=true`` where that is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from helpers import by_name, fleet, shim_record, wait_for

T = TypeVar("T")

pytestmark = [pytest.mark.tmux, pytest.mark.timeout(90)]

DEMO_NAMES = (
    "scaffold",
    "user-schema",
    "docs-pass",
    "flaky-tests",
    "api-client",
    "search-index",
    "long-refact",  # "long-refactor" is cut to "long-refact…" by the name column
)
QUESTION = "Which license header should new files carry?"


def tmux_program() -> str:
    path = shutil.which("tmux")
    if path is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("tmux is not installed (CI=true): apt-get install tmux")
        pytest.skip("tmux is not installed: apt-get install tmux (or brew install tmux)")
    return path


@dataclass
class Cockpit:
    """`fleet-tui --home HOME demo` in a detached tmux session on a private socket."""

    tmux: str
    socket: str
    conf: Path
    home: Path
    target: str = "cockpit"

    def cmd(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.tmux, "-L", self.socket, "-f", str(self.conf), *args],
            capture_output=True,
            text=True,
            timeout=15,
            check=check,
            stdin=subprocess.DEVNULL,
            env=clean_env(),
        )

    def start(self, script: Path, width: int, height: int) -> None:
        self.cmd("new-session", "-d", "-s", self.target, "-x", str(width), "-y", str(height), str(script))

    def screen(self) -> str:
        return self.cmd("capture-pane", "-p", "-t", self.target).stdout

    def keys(self, *keys: str) -> None:
        """Named keys (``Enter``, ``Escape``) or single characters, one ``send-keys`` each."""
        for key in keys:
            self.cmd("send-keys", "-t", self.target, key)

    def type(self, text: str) -> None:
        self.cmd("send-keys", "-t", self.target, "-l", text)

    def pane(self, fmt: str) -> str:
        return self.cmd("display-message", "-p", "-t", self.target, fmt).stdout.strip()

    def wait(self, cond: Callable[[], T], *, timeout: float = 30.0, what: str, interval: float = 0.2) -> T:
        """``wait_for`` whose failure message carries the screen at that moment."""
        try:
            return wait_for(cond, timeout=timeout, interval=interval, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- screen ---\n{self.screen()}") from None

    def wait_screen(self, *needles: str, timeout: float = 30.0, what: str = "") -> str:
        """Poll capture-pane until every needle is on the screen."""

        def shown() -> str:
            text = self.screen()
            return text if all(n in text for n in needles) else ""

        return self.wait(
            shown,
            timeout=timeout,
            interval=0.1,
            what=what or f"{needles!r} on screen",
        )

    def kill_server(self) -> None:
        """Kill the server and remove its socket file (tmux leaves it behind in /tmp/tmux-UID)."""
        found = self.cmd("display-message", "-p", "#{socket_path}", check=False).stdout.strip()
        self.cmd("kill-server", check=False)
        default = Path(os.environ.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}" / self.socket
        path = Path(found) if found.endswith(self.socket) else default
        path.unlink(missing_ok=True)


def clean_env() -> dict[str, str]:
    """The environment for tmux (its server hands it to the pane), passed explicitly: under pytest
    the C-level environment carries COLUMNS=80 LINES=24 (not in ``os.environ``), which a child
    inherits and which makes Textual draw 80x24 whatever the pane's size."""
    drop = ("COLUMNS", "LINES", "TMUX", "TMUX_PANE", "FLEET_STORE", "FLEET_HOME")
    return {k: v for k, v in os.environ.items() if k not in drop}


def home_processes(home: Path) -> list[psutil.Process]:
    """Processes (not this one) whose command line names the home or whose cwd is inside it."""
    key = str(home)
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd", "status"]):
        if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cmdline = " ".join(proc.info["cmdline"] or ())
        cwd = proc.info["cwd"] or ""
        if key in cmdline or cwd == key or cwd.startswith(key + os.sep):
            found.append(proc)
    return found


def describe(procs: list[psutil.Process]) -> str:
    lines = []
    for p in procs:
        try:
            lines.append(f"{p.pid} {' '.join(p.cmdline())[:160]} (cwd {p.cwd()})")
        except psutil.Error:
            lines.append(f"{p.pid} (gone)")
    return "\n".join(lines)


@pytest.fixture
def cockpit(tmp_path: Path) -> Iterator[Cockpit]:
    """A tmux server of its own; killed at the end with whatever still runs in the home."""
    tmux = tmux_program()
    home = tmp_path / "home"  # created by `demo` (it must be empty or new)
    conf = tmp_path / "tmux.conf"
    conf.write_text("set -g status off\nset -g remain-on-exit on\nset -g history-limit 2000\n")
    cp = Cockpit(tmux, f"fleet-e2e-{os.getpid()}-{uuid.uuid4().hex[:8]}", conf, home)
    try:
        yield cp
    finally:
        cp.kill_server()
        for proc in home_processes(home):  # a failed run must not leave agents behind
            try:
                proc.kill()
            except psutil.Error:
                pass


def launcher(tmp_path: Path, home: Path) -> Path:
    """The pane's program: a script outside the home (so the tmux server's own command line never
    names it) that runs the cockpit and records its exit status in ``cockpit.exit`` (tmux 3.3's
    ``#{pane_dead_status}`` is sometimes left empty when the pty closes before the reap)."""
    script = tmp_path / "cockpit.sh"
    # the tmux server passes on this process's environment; the store comes from --home only
    script.write_text(
        "#!/bin/sh\nunset FLEET_STORE FLEET_HOME TMUX COLUMNS LINES\nexport TERM=xterm-256color\n"
        + f"cd {_sh(str(tmp_path))}\n"
        + f"{_sh(sys.executable)} -m fleet_tui --home {_sh(str(home))} demo\n"
        + f"echo $? > {_sh(str(tmp_path / 'cockpit.exit'))}\n"
    )
    script.chmod(0o755)
    return script


def _sh(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def pending_questions(home: Path) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads(fleet(home, "questions", "--json").stdout)
    return [q for q in data if q.get("status", "pending") == "pending"]


def log_events(home: Path, task: str) -> list[dict[str, Any]]:
    out = fleet(home, "logs", task, "--json").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def quit_stopping_all(cp: Cockpit) -> None:
    """``q``, then "stop all" (``x``) when the dialog asks; wait for the cockpit to exit 0."""
    cp.keys("q")

    def dialog_or_exit() -> str:
        if cp.pane("#{pane_dead}") == "1":
            return "exited"
        return "dialog" if "Stop all" in cp.screen() else ""

    if cp.wait(dialog_or_exit, timeout=15, what="the quit dialog (or the cockpit exiting)") == "dialog":
        cp.keys("x")
    exit_file = cp.conf.parent / "cockpit.exit"
    cp.wait(
        lambda: cp.pane("#{pane_dead}") == "1" and exit_file.exists(),
        timeout=45,
        what="the cockpit process to exit",
    )
    status = exit_file.read_text().strip()
    assert status == "0", f"the cockpit exited with {status}\n{cp.screen()}"


def assert_no_agents_left(home: Path) -> None:
    """Stop all means stopped: nothing of the home survives the cockpit (a short grace for the
    kernel to finish tearing down processes that were already told to go)."""
    deadline = time.monotonic() + 5
    left = home_processes(home)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = home_processes(home)
    assert not left, "processes of the home outlived the cockpit:\n" + describe(left)


def test_cockpit_answer_kill_quit_in_tmux(cockpit: Cockpit, tmp_path: Path) -> None:
    cp, home = cockpit, cockpit.home
    t0 = time.monotonic()
    cp.start(launcher(tmp_path, home), 120, 36)
    assert cp.pane("#{pane_width}x#{pane_height}") == "120x36"
    shell = psutil.Process(int(cp.pane("#{pane_pid}")))
    cockpit_proc = cp.wait(lambda: shell.children(), timeout=10, what="the cockpit process")[0]

    # the four panes and the demo fleet, as the user sees them
    cp.wait_screen("Queue", "Stream", "Inbox", "Gauges", *DEMO_NAMES, what="panes and task names")

    # docs-pass asks; the store has it, then the inbox shows it
    cp.wait(
        lambda: [q for q in pending_questions(home) if q["task"] == "docs-pass" and q["text"] == QUESTION],
        timeout=30,
        interval=0.3,
        what="docs-pass's question in the store",
    )
    cp.wait_screen("Inbox (1)", "docs-pass: Which license header", what="the question in the inbox")
    cp.keys("a")
    cp.wait_screen(f"docs-pass asks: {QUESTION}", "1. MIT", what="the inline answer form")
    cp.type("MIT")
    cp.keys("Enter")
    cp.wait(lambda: not pending_questions(home), timeout=20, interval=0.3, what="the question answered")
    answers = cp.wait(
        lambda: [
            e for e in log_events(home, "docs-pass") if e["kind"] == "tool_result" and e.get("text") == "MIT"
        ],
        timeout=20,
        interval=0.3,
        what="the agent receiving the answer MIT",
    )
    assert len(answers) == 1
    cp.wait(
        lambda: by_name(home)["docs-pass"]["status"] == "done",
        timeout=30,
        interval=0.3,
        what="docs-pass done",
    )

    # select long-refactor with the filter, kill it, confirm
    cp.wait(
        lambda: by_name(home)["long-refactor"]["status"] == "running",
        timeout=30,
        interval=0.3,
        what="long-refactor running",
    )
    cp.keys("/")
    cp.type("long-refactor")
    cp.keys("Enter")
    screen = cp.wait_screen(
        "Queue (1 of 7", "Stream: long-refactor", what="the queue filtered to long-refactor"
    )
    assert "docs-pass" not in screen.split("Stream:")[0], screen
    cp.keys("k")
    cp.wait_screen("Kill long-refactor?", what="the kill confirmation")
    cp.keys("y")
    killed = cp.wait(
        lambda: (t := by_name(home)["long-refactor"])["status"] == "needs_human" and t,
        timeout=30,
        interval=0.3,
        what="long-refactor parked",
    )
    assert killed["reason"] == "killed_by_user", killed

    # retry it (still selected) so an agent is running when we quit
    cp.keys("r")
    cp.wait(
        lambda: (t := by_name(home)["long-refactor"])["status"] == "running" and t["attempt"] == 2,
        timeout=30,
        interval=0.3,
        what="long-refactor running again (attempt 2)",
    )
    cp.wait_screen("Queue (1 of 7", "attempt 2", what="the retried attempt on screen")

    # quit, stopping every agent
    quit_stopping_all(cp)
    assert not cockpit_proc.is_running() or cockpit_proc.status() == psutil.STATUS_ZOMBIE
    assert_no_agents_left(home)
    after = by_name(home)
    assert after["long-refactor"]["status"] != "running", after["long-refactor"]
    print(f"tmux cockpit flow took {time.monotonic() - t0:.1f}s")


def test_cockpit_80x24_shows_the_queue(cockpit: Cockpit, tmp_path: Path) -> None:
    cp, home = cockpit, cockpit.home
    cp.start(launcher(tmp_path, home), 80, 24)
    assert cp.pane("#{pane_width}x#{pane_height}") == "80x24"
    screen = cp.wait_screen("Queue (7)", "Stream", "Inbox", "Gauges", what="the panes at 80x24")

    def names_shown() -> list[str]:
        nonlocal screen
        screen = cp.screen()
        top = screen.split("Stream")[0]  # the queue pane is above the stream pane
        shown = [n for n in DEMO_NAMES if n in top]
        return shown if len(shown) >= 4 else []

    cp.wait(names_shown, timeout=20, what="task names in the queue at 80x24")
    assert all(len(line) <= 80 for line in screen.splitlines()), screen
    quit_stopping_all(cp)
    assert_no_agents_left(home)


def one_agent_in_tmux(
    cp: Cockpit, tmp_path: Path, config: str, prompt: str, *args: str
) -> tuple[psutil.Process, psutil.Process, Path]:
    """A home of one sim task (``prompt``) and ``fleet-tui --home HOME ARGS`` as the pane's own
    process (exec'd), once the task's agent runs: (that process, the agent, the attempt folder)."""
    home = cp.home
    home.mkdir()
    (home / "config.toml").write_text("max_load_per_core = 1000.0\n" + config)
    work = tmp_path / "work"
    work.mkdir()
    tasks = tmp_path / "tasks.toml"
    tasks.write_text(f'[[task]]\nname = "long"\ncoder = "sim"\ncwd = "{work}"\nprompt = "{prompt}"\n')
    fleet(home, "load", str(tasks))
    script = tmp_path / "pane.sh"
    script.write_text(
        "#!/bin/sh\nunset FLEET_STORE FLEET_HOME TMUX COLUMNS LINES\nexport TERM=xterm-256color\n"
        + f"cd {_sh(str(tmp_path))}\nexec {_sh(sys.executable)} -m fleet_tui --home {_sh(str(home))} "
        + " ".join(args)
        + "\n"
    )
    script.chmod(0o755)
    cp.start(script, 120, 36)
    proc = psutil.Process(int(cp.pane("#{pane_pid}")))  # exec: the pane's process itself
    cp.wait(lambda: by_name(home)["long"]["status"] == "running", timeout=30, what="the agent running")
    attempt = home / "tasks" / by_name(home)["long"]["id"] / "attempts" / "1"
    agent = psutil.Process(shim_record(attempt)["agent_pid"])
    return proc, agent, attempt


def gone(proc: psutil.Process) -> bool:
    return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE


def test_a_terminal_that_hangs_up_leaves_the_agents_to_be_adopted(cockpit: Cockpit, tmp_path: Path) -> None:
    """The terminal goes away under the cockpit (the ssh session drops, the tmux server dies):
    SIGHUP. It used to end the process at once: its agent ran on unsupervised until the lease ran
    out, then was killed and its work lost. Now the cockpit closes as ``q`` would with nobody to
    answer: it leaves the agent running under a long lease, and exits; the next engine adopts the
    agent and finishes its attempt (no second attempt)."""
    cp, home = cockpit, cockpit.home
    config = "lease_s = 4.0\nheartbeat_s = 1.0\n"
    cockpit_proc, agent, attempt = one_agent_in_tmux(cp, tmp_path, config, "@sim steps=40 pace=0.25")

    cp.kill_server()  # the terminal hangs up
    wait_for(lambda: gone(cockpit_proc), timeout=30, what="the cockpit to exit after the hangup")
    # left running, not stopped: its lease now runs for hours (leave_running_h), not seconds
    deadline = float((attempt / "lease").read_text().strip())
    assert deadline > time.time() + 1800, f"the lease ends in {deadline - time.time():.0f} s"
    assert not gone(agent), "the agent was stopped"

    fleet(home, "run", "--until-idle", timeout=120)  # the next engine adopts it
    done = by_name(home)["long"]
    assert (done["status"], done["attempt"]) == ("done", 1), done


def test_a_demo_on_a_temporary_home_stops_its_agents_when_the_terminal_hangs_up(
    cockpit: Cockpit, tmp_path: Path
) -> None:
    """`fleet-tui demo` makes a new temporary home each time, so nothing ever adopts what it
    leaves: on a hangup it stops its agents. It left them running under a lease of 12 hours,
    waiting for an adopter that never came (seen by closing a demo's tmux window)."""
    cp = cockpit
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = tmp_path / "demo.sh"
    script.write_text(
        "#!/bin/sh\nunset FLEET_STORE FLEET_HOME TMUX COLUMNS LINES\nexport TERM=xterm-256color\n"
        + f"export TMPDIR={_sh(str(tmp))}\ncd {_sh(str(tmp_path))}\n"
        + f"exec {_sh(sys.executable)} -m fleet_tui demo\n"
    )
    script.chmod(0o755)
    cp.start(script, 120, 36)
    cockpit_proc = psutil.Process(int(cp.pane("#{pane_pid}")))  # exec: the pane's process itself
    found = cp.wait(lambda: next(tmp.glob("fleet-demo-*"), None), timeout=20, what="the demo's home")
    assert found is not None
    home: Path = found
    try:
        cp.wait(
            lambda: [
                t for t in json.loads(fleet(home, "status", "--json").stdout) if t["status"] == "running"
            ],
            timeout=30,
            what="an agent running",
        )
        assert home_processes(home), "no agent process of the demo's home to stop"
        cp.kill_server()  # the terminal hangs up
        wait_for(lambda: gone(cockpit_proc), timeout=30, what="the cockpit to exit after the hangup")
        assert_no_agents_left(home)
    finally:
        for proc in home_processes(home):
            proc.kill()


def test_a_headless_run_whose_terminal_hangs_up_stops_as_on_sigterm(cockpit: Cockpit, tmp_path: Path) -> None:
    """`fleet-tui run` started in a terminal that goes away: SIGHUP ends the run as SIGTERM does
    (the agent stopped, its task queued again), whatever it can no longer print. Unhandled, it
    ended the process at once and left the task running under a dead engine."""
    cp, home = cockpit, cockpit.home
    run, agent, _ = one_agent_in_tmux(cp, tmp_path, "", "@sim sleep=60", "run")

    cp.kill_server()  # the terminal hangs up
    wait_for(lambda: gone(run), timeout=30, what="the run to end after the hangup")
    after = by_name(home)["long"]
    assert after["status"] == "queued", after
    wait_for(lambda: gone(agent), timeout=15, what="the agent to be stopped")
