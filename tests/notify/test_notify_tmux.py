"""Terminal notifications reach tmux from the cockpit while the person looks at another window.

A private tmux server: window 0 is what the person looks at, window 1 runs the real cockpit
(engine inside). A task there gets parked ``needs_human``; the cockpit's terminal channel writes a
bell and an OSC 9 notification (wrapped for tmux passthrough), so tmux flags window 1
(``#{window_bell_flag}``, what the status line shows and alert hooks fire on) and the raw bytes it
received (``pipe-pane``) hold the notification naming the task. The cockpit only rings on its own
for questions, so the flag here comes from the notification path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
from tests.notify.receiver import need_program

from helpers import fleet, quiet_home, wait_for

pytestmark = [pytest.mark.tmux, pytest.mark.timeout(120)]


def _sh(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def test_a_parked_task_rings_tmux_from_the_cockpit_in_a_background_window(tmp_path: Path) -> None:
    tmux = need_program("tmux", "tmux")
    home = tmp_path / "home"
    quiet_home(home)
    with (home / "config.toml").open("a") as fh:
        fh.write('notify_desktop = "off"\nnotify_terminal = "osc9"\non_quit = "stop"\n')
    fleet(home, "add", "@sim wait-file=go.txt timeout=100\n@sim fail=boom", "--coder", "sim",
          "--name", "parked", "--cwd", str(tmp_path), "--max-retries", "0")  # fmt: skip
    conf = tmp_path / "tmux.conf"
    conf.write_text(
        "set -g status off\nset -g allow-passthrough on\nset -g monitor-bell on\nset -g bell-action any\n"
    )
    script = tmp_path / "cockpit.sh"
    script.write_text(
        "#!/bin/sh\nunset FLEET_STORE FLEET_HOME COLUMNS LINES\nexport TERM=xterm-256color\n"
        f"exec {_sh(sys.executable)} -m fleet_tui --home {_sh(str(home))}\n"
    )
    script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TMUX", "TMUX_PANE")}
    sock = f"fleet-notify-{os.getpid()}-{uuid.uuid4().hex[:6]}"

    def t(*args: str) -> str:
        return subprocess.run(
            [tmux, "-L", sock, "-f", str(conf), *args], capture_output=True, text=True, timeout=15,
            check=True, env=env, stdin=subprocess.DEVNULL,
        ).stdout.strip()  # fmt: skip

    raw = tmp_path / "pane.raw"
    try:
        t("new-session", "-d", "-s", "s", "-x", "120", "-y", "36", "-n", "shell", "cat")
        t("new-window", "-d", "-t", "s:1", "-n", "cockpit", str(script))
        t("pipe-pane", "-t", "s:1", "-o", f"cat >> {_sh(str(raw))}")
        wait_for(lambda: "parked" in t("capture-pane", "-p", "-t", "s:1"), 60, 0.2, "the cockpit's queue")
        assert t("display-message", "-p", "-t", "s", "#{window_index}") == "0"  # the person is elsewhere
        assert t("display-message", "-p", "-t", "s:1", "#{window_bell_flag}") == "0"
        (tmp_path / "go.txt").write_text("go")
        wait_for(
            lambda: t("display-message", "-p", "-t", "s:1", "#{window_bell_flag}") == "1",
            90, 0.2, "tmux flagging the cockpit's window",
        )  # fmt: skip
        data = wait_for(
            lambda: raw.read_bytes() if b"needs you" in raw.read_bytes() else b"", 30, 0.1, "OSC 9"
        )
        assert b"\x1bPtmux;\x1b\x1b]9;parked needs you: retries_exhausted" in data
        assert t("display-message", "-p", "-t", "s:0", "#{window_bell_flag}") == "0"
    finally:
        subprocess.run([tmux, "-L", sock, "kill-server"], capture_output=True, env=env, check=False)
        for proc in psutil.process_iter(["cmdline"]):
            if str(home) in " ".join(proc.info["cmdline"] or ()) and proc.pid != os.getpid():
                try:
                    proc.kill()
                except psutil.Error:
                    pass
