"""The queue of the real cockpit in real tmux, at 80x24 and 200x60, over many repositories.

A home holds 180 tasks in 12 git repositories (two with long names that share a prefix), loaded
with `fleet-tui load` and the fleet paused so nothing runs. `fleet-tui --home HOME` opens in a
tmux pane of each size; the screen is read with ``capture-pane``: repository headers with counts,
``? help`` and ``q quit`` in the footer, the header line not cut, long names whole at 200x60; `j`
jumps to a task typed in part (the stream follows it), `q` quits (nothing runs: no question).

Every wait is on the screen or a file, never a bare sleep. The tmux server has its own socket and
is killed at the end whatever happens. Marked ``tmux``; skipped when tmux is missing, except under
``CI=true`` where that is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from helpers import fleet, wait_for

pytestmark = [pytest.mark.tmux, pytest.mark.timeout(120)]

REPOS = 12
PER_REPO = 15
LONG = ("refactor-payments-api-client-retry-policy", "refactor-payments-api-client-timeouts")


def tmux_program() -> str:
    path = shutil.which("tmux")
    if path is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("tmux is not installed (CI=true): apt-get install tmux")
        pytest.skip("tmux is not installed: apt-get install tmux (or brew install tmux)")
    return path


def _sh(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


class Tmux:
    def __init__(self, tmux: str, conf: Path) -> None:
        self.tmux = tmux
        self.conf = conf
        self.socket = f"fleet-queue-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def cmd(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        # COLUMNS/LINES from pytest's C-level environment would pin Textual to 80x24
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TMUX", "FLEET_HOME")}
        return subprocess.run(
            [self.tmux, "-L", self.socket, "-f", str(self.conf), *args],
            capture_output=True,
            text=True,
            timeout=15,
            check=check,
            stdin=subprocess.DEVNULL,
            env=env,
        )

    def screen(self, target: str) -> str:
        return self.cmd("capture-pane", "-p", "-t", target).stdout

    def wait_screen(self, target: str, *needles: str, timeout: float = 40.0) -> str:
        def shown() -> str:
            text = self.screen(target)
            return text if all(n in text for n in needles) else ""

        try:
            return wait_for(shown, timeout=timeout, interval=0.1, what=f"{needles!r} on screen")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- screen ---\n{self.screen(target)}") from None

    def kill(self) -> None:
        found = self.cmd("display-message", "-p", "#{socket_path}", check=False).stdout.strip()
        self.cmd("kill-server", check=False)
        if found.endswith(self.socket):
            Path(found).unlink(missing_ok=True)


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    conf = tmp_path / "tmux.conf"
    conf.write_text("set -g status off\nset -g remain-on-exit on\n")
    t = Tmux(tmux_program(), conf)
    try:
        yield t
    finally:
        t.kill()
        home = str(tmp_path / "home")
        for proc in psutil.process_iter(["cmdline"]):
            if proc.pid != os.getpid() and home in " ".join(proc.info["cmdline"] or ()):
                try:
                    proc.kill()
                except psutil.Error:
                    pass


@pytest.fixture
def backlog(tmp_path: Path) -> Path:
    """A paused home with 180 tasks over 12 git repositories."""
    lines = []
    for r in range(REPOS):
        repo = tmp_path / "src" / f"repo-{r:02d}"
        repo.mkdir(parents=True)
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        for k in range(PER_REPO):
            name = LONG[k] if r == 0 and k < 2 else f"repo-{r:02d}-task-{k:02d}"
            lines.append(f'[[task]]\nname = "{name}"\nprompt = "x"\ncoder = "sim"\ncwd = "{repo}"\n')
    (tmp_path / "tasks.toml").write_text("\n".join(lines))
    home = tmp_path / "home"
    fleet(home, "load", str(tmp_path / "tasks.toml"))
    fleet(home, "pause", "--all")
    return home


def open_cockpit(tmux: Tmux, tmp_path: Path, home: Path, target: str, size: tuple[int, int]) -> Path:
    done = tmp_path / f"{target}.exit"
    script = tmp_path / f"{target}.sh"
    script.write_text(
        "#!/bin/sh\nunset FLEET_STORE FLEET_HOME TMUX COLUMNS LINES\nexport TERM=xterm-256color\n"
        f"{_sh(sys.executable)} -m fleet_tui --home {_sh(str(home))}\necho $? > {_sh(str(done))}\n"
    )
    script.chmod(0o755)
    tmux.cmd("new-session", "-d", "-s", target, "-x", str(size[0]), "-y", str(size[1]), str(script))
    return done


@pytest.mark.parametrize("size", [(80, 24), (200, 60)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_queue_over_many_repositories_in_tmux(
    tmux: Tmux, backlog: Path, tmp_path: Path, size: tuple[int, int]
) -> None:
    target = f"q{size[0]}"
    done = open_cockpit(tmux, tmp_path, backlog, target, size)
    screen = tmux.wait_screen(target, f"Queue ({REPOS * PER_REPO})", "? help", "q quit", "▾ repo-0")
    lines = screen.splitlines()
    assert len(lines) == size[1]
    assert "? help" in lines[-1] and "q quit" in lines[-1]
    assert not lines[0].rstrip().endswith("…")  # the header line fits
    assert f"· {PER_REPO} · ◌ {PER_REPO}" in screen  # a repository header counts its states
    if size[0] >= 200:
        for name in LONG:
            assert name in screen  # whole, side by side with the other columns
    # the filter, then Enter and j in one burst: j opens the jump box, it is not typed into the filter
    tmux.cmd("send-keys", "-t", target, "/")
    tmux.cmd("send-keys", "-t", target, "-l", "repo:repo-03")
    tmux.wait_screen(target, f"Queue ({PER_REPO} of {REPOS * PER_REPO} · repo:repo-03)")
    tmux.cmd("send-keys", "-t", target, "Enter", "j")
    tmux.wait_screen(target, "jump to: type part of a name")
    assert "repo-03j" not in tmux.screen(target)
    # (Escape is sent alone: a terminal reads Escape followed by a key as alt+key)
    tmux.cmd("send-keys", "-t", target, "Escape")
    wait_for(lambda: "jump to:" not in tmux.screen(target), timeout=30, what="the jump box to close")
    tmux.cmd("send-keys", "-t", target, "/")
    tmux.cmd("send-keys", "-t", target, "Escape")  # the filter cleared
    tmux.wait_screen(target, f"Queue ({REPOS * PER_REPO})")
    # jump: part of a name, fuzzy; the stream follows the task the cursor lands on
    tmux.cmd("send-keys", "-t", target, "j")
    tmux.cmd("send-keys", "-t", target, "-l", "r11task14")
    tmux.wait_screen(target, "Stream: repo-11-task-14")
    # Enter and q in one burst: q must reach the cockpit (quit), not the closing jump box
    tmux.cmd("send-keys", "-t", target, "Enter", "q")  # nothing runs: quits without asking
    try:
        wait_for(lambda: done.exists() and done.read_text().strip(), timeout=30, what="the cockpit to exit")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- screen ---\n{tmux.screen(target)}") from None
    assert done.read_text().strip() == "0"
