"""The idle cockpit as a user runs it: `fleet-tui` (the cockpit with its engine inside) in a real
terminal (tmux, 160x48) on a home with three finished tasks, nothing queued, no key pressed: the
CPU of its whole process tree (the cockpit, its engine's thread, the fork server it keeps) over a
window, against a bare Textual app (one DataTable of three rows and a footer) in the same
terminal, measured in the same run.

The three tasks are `true` run by the `shell` coder through `run --until-idle` first, with the
DEFAULT configuration (an empty fleet home). Each program runs ``--settle`` seconds before its
window, so the figure is a cockpit at rest, not its start. The goal (issue 14) is <= 1 % of a
core; the bare app's figure says what Textual itself costs here.

It prints figures and ratios; it asserts nothing.

    python bench/bench_cockpit_idle.py [--seconds 30] [--settle 5] [--runs 1]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

FLEET = [sys.executable, "-m", "fleet_tui"]
TMUX_CONF = "set -g status off\nset -g remain-on-exit off\nset -g default-terminal xterm-256color\n"

BARE_APP = """
from textual.app import App, ComposeResult
from textual.widgets import DataTable, Footer


class Bare(App[None]):
    BINDINGS = [("q", "quit", "Quit")]

    def compose(self) -> ComposeResult:
        yield DataTable()
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("id", "name", "status")
        for i in range(3):
            table.add_row(str(i + 1), f"b{i:04d}", "done")


Bare().run()
"""


def tree_cpu(root: psutil.Process) -> float:
    """CPU seconds of ``root`` and every live descendant (their own and their reaped children's)."""
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class Terminal:
    """One detached tmux session on a private socket, 160x48."""

    def __init__(self, scratch: Path) -> None:
        self.tmux = shutil.which("tmux") or sys.exit("tmux is not installed (apt-get install tmux)")
        self.socket = f"bench-idle-{os.getpid()}"
        self.conf = scratch / "tmux.conf"
        self.conf.write_text(TMUX_CONF)

    def cmd(self, *args: str) -> str:
        done = subprocess.run(
            [self.tmux, "-L", self.socket, "-f", str(self.conf), *args],
            capture_output=True,
            text=True,
            timeout=15,
            stdin=subprocess.DEVNULL,
        )
        return done.stdout

    def start(self, argv: list[str], env: dict[str, str]) -> psutil.Process:
        exports = [f"{k}={v}" for k, v in env.items()]
        # bytecode cached, as an installed fleet-tui has it
        command = shlex.join(["env", "-u", "PYTHONDONTWRITEBYTECODE", *exports, *argv])
        self.cmd("new-session", "-d", "-s", "bench", "-x", "160", "-y", "48", command)
        pid = int(self.cmd("display-message", "-p", "-t", "bench", "#{pane_pid}").strip())
        return psutil.Process(pid)

    def screen(self) -> str:
        return self.cmd("capture-pane", "-p", "-t", "bench")

    def kill(self) -> None:
        self.cmd("kill-server")


def measure(term: Terminal, argv: list[str], env: dict[str, str], settle: float, seconds: float) -> float:
    """CPU % of one core of ``argv``'s process tree at rest in the terminal."""
    proc = term.start(argv, env)
    try:
        deadline = time.monotonic() + 30
        while len(term.screen().strip()) < 20:  # something drawn
            if time.monotonic() > deadline:
                raise SystemExit(f"nothing drawn in 30 s by {' '.join(argv)}:\n{term.screen()}")
            time.sleep(0.1)
        time.sleep(settle)
        c0, t0 = tree_cpu(proc), time.monotonic()
        time.sleep(seconds)
        c1, t1 = tree_cpu(proc), time.monotonic()
        if not proc.is_running():
            raise SystemExit(f"{' '.join(argv)} ended during its window:\n{term.screen()}")
        return (c1 - c0) / (t1 - t0) * 100
    finally:
        leftovers = [proc, *proc.children(recursive=True)] if proc.is_running() else []
        term.kill()
        for p in leftovers:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(leftovers, timeout=10)


def finished_home(scratch: Path) -> dict[str, str]:
    """A fleet home with three done `true` tasks, default config; the environment to reach it."""
    home = scratch / "home"
    home.mkdir()
    lines = ["[defaults]", 'coder = "shell"', 'command = "true"', ""]
    for i in range(3):
        lines += ["[[task]]", f'name = "b{i:04d}"', 'prompt = "x"', ""]
    (scratch / "t.toml").write_text("\n".join(lines))
    env = {"FLEET_HOME": str(home), "TERM": "xterm-256color"}
    full = dict(os.environ, **env)
    full.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([*FLEET, "load", str(scratch / "t.toml")], check=True, env=full, capture_output=True)
    subprocess.run([*FLEET, "run", "--until-idle"], check=True, env=full, capture_output=True, timeout=120)
    out = subprocess.run([*FLEET, "status"], check=True, env=full, capture_output=True, text=True).stdout
    if out.count("done") < 3:
        raise SystemExit(f"the three tasks did not finish:\n{out}")
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--seconds", type=float, default=30.0, help="the measured window")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds at rest before the window")
    ap.add_argument("--runs", type=int, default=1, help="pairs measured in turn")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {args.seconds:.0f} s windows")
    with tempfile.TemporaryDirectory() as d:
        scratch = Path(d)
        env = finished_home(scratch)
        (scratch / "bare.py").write_text(BARE_APP)
        term = Terminal(scratch)
        python = sys.executable
        for run in range(args.runs):
            bare = measure(term, [python, str(scratch / "bare.py")], env, args.settle, args.seconds)
            fleet = measure(term, [python, "-m", "fleet_tui"], env, args.settle, args.seconds)
            print(
                f"run {run + 1}: bare Textual app {bare:5.2f} % · fleet-tui cockpit, 3 finished tasks "
                f"{fleet:5.2f} % of a core ({fleet / bare:.1f}x the bare app; goal <= 1 %)"
            )


if __name__ == "__main__":
    main()
