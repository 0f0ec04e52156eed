"""Agent output cannot drive the user's terminal (issue 12, point 1), checked in real tmux.

A shell-coder agent prints an OSC 52 clipboard write, an OSC 0 title, a screen clear and an OSC 8
hyperlink. The cockpit runs in tmux with ``set-clipboard on`` (so a clipboard write would land in
a tmux paste buffer) and shows that agent's stream; afterwards tmux has no paste buffer and the
pane title is what it was. A control pane that prints the same bytes raw proves the setup would
have seen it: there the buffer and the title do change.

Marked ``tmux``. Skipped when tmux is missing, except under ``CI=true`` where that is a failure.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from tests.e2e.test_tmux_cockpit import Cockpit, _sh, home_processes, quit_stopping_all, tmux_program

from helpers import by_name, fleet

pytestmark = [pytest.mark.tmux, pytest.mark.timeout(90)]

PAYLOAD = "aGFja2VkLWNsaXBib2FyZA=="  # base64("hacked-clipboard")
AGENT = (
    "#!/bin/sh\n"
    f"printf 'pwn-start \\033]52;c;{PAYLOAD}\\007 \\033]0;owned-title\\007 \\033[2J mid-pwn\\n'\n"
    "printf 'link \\033]8;;http://evil.example/\\033\\\\click\\033]8;;\\033\\\\ pwn-end\\n'\n"
)


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Cockpit]:
    conf = tmp_path / "tmux.conf"
    conf.write_text("set -g status off\nset -g remain-on-exit on\nset -g set-clipboard on\n")
    cp = Cockpit(
        tmux_program(), f"fleet-hostile-{os.getpid()}-{uuid.uuid4().hex[:8]}", conf, tmp_path / "home"
    )
    try:
        yield cp
    finally:
        cp.kill_server()
        for proc in home_processes(cp.home):
            try:
                proc.kill()
            except psutil.Error:
                pass


def buffers(cp: Cockpit) -> str:
    return cp.cmd("list-buffers", check=False).stdout.strip()


def test_agent_escapes_do_not_reach_tmux(tmux: Cockpit, tmp_path: Path) -> None:
    cp, home = tmux, tmux.home
    agent = tmp_path / "agent.sh"
    agent.write_text(AGENT)
    agent.chmod(0o755)
    fleet(home, "add", "print hostile text", "--name", "evil", "--coder", "shell", "--command", str(agent))
    script = tmp_path / "cockpit.sh"
    script.write_text(
        "#!/bin/sh\nunset FLEET_STORE FLEET_HOME TMUX COLUMNS LINES\nexport TERM=xterm-256color\n"
        f"cd {_sh(str(tmp_path))}\n{_sh(sys.executable)} -m fleet_tui --home {_sh(str(home))}\n"
        f"echo $? > {_sh(str(tmp_path / 'cockpit.exit'))}\n"
    )
    script.chmod(0o755)
    cp.start(script, 120, 36)
    title = cp.pane("#{pane_title}")
    assert buffers(cp) == ""

    cp.wait(lambda: by_name(home)["evil"]["status"] != "queued", timeout=30, what="the agent ran")
    # on a slow machine the task may be done before the cockpit's first screen: folded away
    shown = cp.wait(
        lambda: next((s for s in ("Stream: evil", "folded away") if s in cp.screen()), None),
        what="the task shown or folded",
    )
    if shown == "folded away":
        cp.keys("f")
    screen = cp.wait_screen("Stream: evil", "pwn-start", "pwn-end", what="the agent's output in the stream")
    assert f"␛]52;c;{PAYLOAD}␇" in screen and "␛]0;owned-title␇" in screen  # shown, as text
    assert buffers(cp) == "", "the agent's OSC 52 wrote a tmux paste buffer"
    assert cp.pane("#{pane_title}") == title, "the agent's OSC 0 set the pane title"
    quit_stopping_all(cp)

    # the control: the same bytes printed raw do reach tmux, so the checks above could fail
    cp.cmd("new-session", "-d", "-s", "raw", "-x", "80", "-y", "24", f"{_sh(str(agent))}; sleep 30")
    cp.wait(lambda: buffers(cp), timeout=10, what="the raw OSC 52 to fill a tmux buffer")
    raw_title = cp.cmd("display-message", "-p", "-t", "raw", "#{pane_title}").stdout.strip()
    assert raw_title == "owned-title"
