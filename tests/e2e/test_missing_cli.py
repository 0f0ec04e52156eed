"""A coder whose program is not installed: every command says so, with the install command.

Why: the first thing a new user meets is a task for a CLI they have not installed (or that lives
on another machine's PATH). fleet-tui must say so before queueing (`validate`, `add`), when
deciding (`plan`), and when a task that needs it is claimed anyway (it was added where the
program existed, or loaded by another process): that task goes to ``needs_human`` with a
``never_started:`` reason carrying the install hint, once, and is not retried in a loop.
`doctor` lists every coder as found or not found.

The program here is ``gemini`` and the PATH is a scratch directory holding only ``sh``,
``python3``, ``git`` and ``env`` (the real CLIs live in /usr/bin, so /usr/bin cannot be on it).
"Present" is a tiny stand-in ``gemini`` script in a second scratch directory, so these tests do
not need any real agent CLI installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fleet_tui.coders.gemini import GeminiCoder
from fleet_tui.scheduler.store.opener import open_store
from helpers import fleet, fleet_env, status

pytestmark = pytest.mark.timeout(120)

HINT = GeminiCoder.install_hint  # "npm install -g @google/gemini-cli"
TOOLS = ("sh", "python3", "git", "env")


@pytest.fixture
def paths(tmp_path: Path) -> tuple[str, str]:
    """(PATH without gemini, PATH with a stand-in gemini that only answers --version)."""
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, f"{tool} is needed on the test machine"
        (bare / tool).symlink_to(found)
    present = tmp_path / "bin-with-gemini"
    present.mkdir()
    stub = present / "gemini"
    stub.write_text("#!/bin/sh\necho 0.0.0-stand-in\n")
    stub.chmod(0o755)
    return str(bare), f"{present}{os.pathsep}{bare}"


def run(home: Path, path: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return fleet(home, *args, check=check, timeout=60, env=fleet_env(home, PATH=path))


def test_validate_fails_with_the_install_command(tmp_path: Path, paths: tuple[str, str]) -> None:
    bare, present = paths
    tasks = tmp_path / "tasks.toml"
    tasks.write_text(f'[[task]]\nname = "g"\nprompt = "hi"\ncoder = "gemini"\ncwd = "{tmp_path}"\n')
    home = tmp_path / "home"
    p = run(home, bare, "validate", str(tasks), check=False)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "gemini" in p.stderr and HINT in p.stderr, p.stderr
    assert f"{tasks}:4:" in p.stderr, p.stderr  # file:line of its `coder =`
    # load validates first and queues nothing
    p = run(home, bare, "load", str(tasks), check=False)
    assert p.returncode == 1 and HINT in p.stderr, p.stderr
    assert status(home) == []
    # with the program on PATH the same file is fine
    assert run(home, present, "validate", str(tasks)).returncode == 0


def test_add_refuses_with_the_install_command(tmp_path: Path, paths: tuple[str, str]) -> None:
    bare, _ = paths
    home = tmp_path / "home"
    p = run(home, bare, "add", "hi", "--coder", "gemini", "--name", "g", "--cwd", str(tmp_path), check=False)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert HINT in p.stderr, p.stderr
    assert status(home) == []


def _added_while_present(tmp_path: Path, present: str) -> Path:
    home = tmp_path / "home"
    run(home, present, "config", "set", "retry_backoff_s", "0")
    run(home, present, "add", "hi", "--coder", "gemini", "--name", "g", "--cwd", str(tmp_path))
    return home


def test_plan_says_the_program_is_missing(tmp_path: Path, paths: tuple[str, str]) -> None:
    bare, present = paths
    home = _added_while_present(tmp_path, present)
    line = run(home, bare, "plan").stdout.strip()
    assert line.startswith("g: waits") and "gemini" in line and HINT in line, line


def test_claimed_task_goes_to_needs_human_once(tmp_path: Path, paths: tuple[str, str]) -> None:
    bare, present = paths
    home = _added_while_present(tmp_path, present)
    p = run(home, bare, "run", "--until-idle", check=False)
    assert p.returncode == 3, p.stdout + p.stderr  # parked: a person must install it
    out = p.stdout
    (t,) = status(home)
    assert t["status"] == "needs_human", (t, out)
    reason = t["reason"] or ""
    assert reason.startswith("never_started:") and "gemini" in reason and HINT in reason, reason
    assert t["retries_used"] == 0 and t["attempt"] == 1, t
    # no loop: a second engine leaves it parked, and exactly one claim was ever made
    assert run(home, bare, "run", "--until-idle", check=False).returncode == 3
    (again,) = status(home)
    assert (again["status"], again["attempt"], again["reason"]) == ("needs_human", 1, reason)
    store = open_store(None, str(home))
    try:
        dsts = [tr.dst for tr in store.transitions(t["id"])]
    finally:
        store.close()
    assert dsts.count("running") == 1 and dsts[-1] == "needs_human", dsts
    # the agent never ran: nothing was captured from it
    assert not list((home / "tasks" / t["id"]).glob("attempts/*/stdout.jsonl"))


def test_doctor_lists_each_coder_found_or_not(tmp_path: Path, paths: tuple[str, str]) -> None:
    bare, present = paths
    home = tmp_path / "home"
    lines = run(home, bare, "doctor").stdout.splitlines()
    coders = {ln.split()[2]: ln for ln in lines if ln.split()[1:2] == ["coder"]}
    assert {"claude", "codex", "opencode", "gemini", "shell", "sim"} <= set(coders), lines
    for name in ("claude", "codex", "opencode", "gemini"):
        assert "not found" in coders[name] and "install it:" in coders[name], coders[name]
    assert HINT in coders["gemini"]
    assert coders["shell"].startswith("ok") and coders["sim"].startswith("ok")
    with_gemini = run(home, present, "doctor").stdout.splitlines()
    (line,) = [ln for ln in with_gemini if ln.split()[1:3] == ["coder", "gemini"]]
    assert line.startswith("ok") and "0.0.0-stand-in" in line and "not found" not in line, line
