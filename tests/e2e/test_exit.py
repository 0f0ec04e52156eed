"""The command leaves without the interpreter's teardown (``cli.entry``), and loses nothing by it:
output larger than a pipe's buffer arrives whole, exit codes stand, exit handlers and threads that
are not daemons still run to their end (the teardown it skips only frees memory)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import fleet, fleet_env, quiet_home

pytestmark = pytest.mark.timeout(120)


def test_output_codes_handlers_and_threads_survive_the_quick_exit(tmp_path: Path) -> None:
    home = quiet_home(tmp_path / "home")
    lines = ["[defaults]", 'coder = "shell"', 'command = "true"', ""]
    for i in range(300):
        lines += ["[[task]]", f'name = "t{i:03d}"', f'prompt = "{"p" * 200}"', ""]
    (tmp_path / "t.toml").write_text("\n".join(lines))
    fleet(home, "load", str(tmp_path / "t.toml"))

    # more than a pipe holds (64 KiB), read only after the process is gone
    out = tmp_path / "status.json"
    with out.open("wb") as f:
        rc = subprocess.run(
            [sys.executable, "-m", "fleet_tui", "status", "--json"], env=fleet_env(home), stdout=f
        ).returncode
    assert rc == 0 and out.stat().st_size > 65536
    assert len(json.loads(out.read_text())) == 300
    piped = subprocess.run(
        [sys.executable, "-m", "fleet_tui", "status", "--json"], env=fleet_env(home), capture_output=True
    )
    assert piped.returncode == 0 and len(json.loads(piped.stdout)) == 300

    # a user error keeps its code and its message
    bad = subprocess.run(
        [sys.executable, "-m", "fleet_tui", "kill", "no-such-task"],
        env=fleet_env(home),
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and "no-such-task" in bad.stderr

    # an exit handler and a thread that is not a daemon (as a library might leave) still finish
    marker = tmp_path / "marker"
    script = (
        "import atexit, sys, threading, time\n"
        "from fleet_tui import cli\n"
        f"atexit.register(lambda: open({str(marker)!r}, 'a').write('handler\\n'))\n"
        f"def late(): time.sleep(0.3); open({str(marker)!r}, 'a').write('thread\\n')\n"
        "threading.Thread(target=late).start()  # still working when the command ends\n"
        "sys.argv = ['fleet-tui', 'status']\n"
        "cli.entry()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=fleet_env(home), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert marker.read_text().splitlines() == ["thread", "handler"]
