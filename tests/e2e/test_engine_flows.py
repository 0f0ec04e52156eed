"""Whole flows through the real `fleet-tui` command in subprocesses (issue 2's required tests)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from helpers import by_name, fleet, fleet_bg, pid_alive, shim_record, status, wait_for

pytestmark = pytest.mark.timeout(300)


def _write_tasks(path: Path, n: int, out: Path) -> None:
    lines = ["[defaults]", 'coder = "shell"', f'command = "echo $FLEET_TASK_ID >> {out}"', ""]
    for i in range(n):
        lines += ["[[task]]", f'name = "t{i:03d}"', f'prompt = "task {i}"', ""]
    path.write_text("\n".join(lines))


def test_eight_processes_drain_500_tasks_exactly_once(tmp_path: Path) -> None:
    home, out, tasks = tmp_path / "home", tmp_path / "out.txt", tmp_path / "tasks.toml"
    _write_tasks(tasks, 500, out)
    fleet(home, "load", str(tasks))
    procs = [
        fleet_bg(home, "run", "--until-idle", "--max-concurrent", "4", log=tmp_path / f"run{i}.log")
        for i in range(8)
    ]
    for p in procs:
        assert p.wait(timeout=280) == 0
    st = status(home)
    assert len(st) == 500
    assert Counter(t["status"] for t in st) == {"done": 500}
    ids = out.read_text().split()
    counts = Counter(ids)
    assert len(ids) == 500, f"{len(ids)} lines for 500 tasks"
    assert set(counts) == {t["id"] for t in st}
    assert max(counts.values()) == 1


@pytest.mark.parametrize("record", ["written", "lost"])
def test_kill9_supervisor_then_restart_adopts_without_second_agent(tmp_path: Path, record: str) -> None:
    """``lost``: the engine died after starting the agents but before writing their attempts'
    records (they are written once an agent runs): they are adopted from their folders."""
    home, log = tmp_path / "home", tmp_path / "side.txt"
    for i in range(4):
        fleet(
            home,
            "add",
            f"adopt {i}",
            "--name",
            f"a{i}",
            "--cwd",
            str(tmp_path),
            "--command",
            f"echo start $FLEET_TASK_NAME >> {log}; sleep 4; echo end $FLEET_TASK_NAME >> {log}",
        )
    run1 = fleet_bg(home, "run", "--max-concurrent", "4", log=tmp_path / "run1.log")
    wait_for(lambda: log.exists() and log.read_text().count("start") == 4, 30, what="four agents started")
    running = [t for t in status(home) if t["status"] == "running"]
    assert len(running) == 4
    os.kill(run1.pid, signal.SIGKILL)
    run1.wait(timeout=10)
    if record == "lost":
        with sqlite3.connect(home / "fleet.db") as db:
            db.execute("DELETE FROM attempts")
    # the agents keep running under their shims while no supervisor exists
    run2 = fleet_bg(home, "run", "--until-idle", "--max-concurrent", "4", log=tmp_path / "run2.log")
    assert run2.wait(timeout=60) == 0, (tmp_path / "run2.log").read_text()
    text = log.read_text().split("\n")
    for i in range(4):
        assert text.count(f"start a{i}") == 1, text
        assert text.count(f"end a{i}") == 1, text
    st = by_name(home)
    assert {t["status"] for t in st.values()} == {"done"}
    assert all(t["attempt"] == 1 for t in st.values())


def test_kill_stops_sigterm_ignoring_agent_and_setsid_grandchild(tmp_path: Path) -> None:
    home = tmp_path / "home"
    fleet(home, "config", "set", "kill_grace_s", "2")
    pidfile = tmp_path / "escapee.pid"
    fleet(
        home,
        "add",
        f"@sim ignore-sigterm\n@sim escape={pidfile} seconds=300\n@sim sleep=300",
        "--coder",
        "sim",
        "--name",
        "stubborn",
        "--cwd",
        str(tmp_path),
    )
    run = fleet_bg(home, "run", log=tmp_path / "run.log")
    try:
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 30, what="the escapee's pid")
        grandchild = int(pidfile.read_text())
        t = by_name(home)["stubborn"]
        shim_info = shim_record(home / "tasks" / t["id"] / "attempts" / "1")
        tree = [shim_info["pid"], shim_info["agent_pid"], grandchild]
        tree += [c.pid for c in psutil.Process(shim_info["pid"]).children(recursive=True)]
        assert os.getsid(grandchild) != os.getsid(shim_info["agent_pid"])  # it really escaped
        started = time.monotonic()
        fleet(home, "kill", "stubborn")
        wait_for(
            lambda: not any(pid_alive(p) for p in tree),
            2 + 2,
            interval=0.05,
            what="every process of the tree to be gone",
        )
        assert time.monotonic() - started <= 2 + 2 + 1.0
        st = by_name(home)["stubborn"]
        assert st["status"] == "needs_human" and st["reason"] == "killed_by_user"
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=30)


def test_garbage_invalid_utf8_huge_and_unterminated_lines(tmp_path: Path) -> None:
    home = tmp_path / "home"
    fleet(
        home,
        "add",
        "@sim garbage=20 invalid-utf8 huge=10M no-final-newline\n@sim say=the-end",
        "--coder",
        "sim",
        "--name",
        "noisy",
        "--cwd",
        str(tmp_path),
    )
    fleet(home, "config", "set", "max_line_bytes", str(1 << 20))
    fleet(
        home,
        "add",
        "@sim huge=3M\n@sim say=after-the-huge-line",
        "--coder",
        "sim",
        "--name",
        "capped",
        "--cwd",
        str(tmp_path),
    )
    run = fleet_bg(home, "run", "--until-idle", log=tmp_path / "run.log")
    peak = 0
    while run.poll() is None:
        try:
            peak = max(peak, psutil.Process(run.pid).memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    assert run.returncode == 0, (tmp_path / "run.log").read_text()
    st = by_name(home)
    assert st["noisy"]["status"] == "done", st["noisy"]
    evs = [json.loads(line) for line in fleet(home, "logs", "noisy", "--json").stdout.splitlines()]
    kinds = Counter(e["kind"] for e in evs)
    assert kinds["result"] == 1 and kinds["text"] >= 5
    assert any("\ufffd" in (e.get("text") or "") for e in evs), "invalid UTF-8 became replacement chars"
    assert any(e["kind"] == "text" and e.get("text") == "the-end" for e in evs)
    # the last line had no newline and still arrived: the result is the last event
    assert evs[-1]["kind"] == "result"
    capped = [json.loads(line) for line in fleet(home, "logs", "capped", "--json").stdout.splitlines()]
    assert [e for e in capped if e["kind"] == "oversized"], "a line over the cap became an oversized event"
    assert any(e.get("text") == "after-the-huge-line" for e in capped)
    raw = fleet(home, "logs", "capped", "--raw").stdout
    assert len(raw) > 3 << 20  # the raw output keeps the whole line
    assert peak < 400 << 20, f"supervisor peaked at {peak >> 20} MiB"


BROKEN = {
    "unknown_key": ('[[task]]\nname = "a"\nprompt = "x"\npriorty = 3\n', 4, "priorty"),
    "duplicate": (
        '[[task]]\nname = "a"\nprompt = "x"\n\n[[task]]\nname = "a"\nprompt = "y"\n',
        6,
        "duplicate",
    ),
    "dangling": ('[[task]]\nname = "a"\nprompt = "x"\ndepends_on = ["ghost"]\n', 4, "ghost"),
    "cycle": (
        '[[task]]\nname = "a"\nprompt = "x"\ndepends_on = ["b"]\n\n'
        '[[task]]\nname = "b"\nprompt = "y"\ndepends_on = ["a"]\n',
        0,
        "cycl",
    ),
    "bad_toml": ('[[task]]\nname = "a"\nprompt = "x\n', 3, ""),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_task_files_report_file_line_and_queue_nothing(tmp_path: Path, case: str) -> None:
    home = tmp_path / "home"
    text, line, needle = BROKEN[case]
    f = tmp_path / "tasks.toml"
    f.write_text(text)
    v = fleet(home, "validate", str(f), check=False)
    assert v.returncode == 1
    first = v.stderr.splitlines()[0]
    assert first.startswith(f"{f}:"), v.stderr
    if line:
        assert f"{f}:{line}:" in v.stderr, v.stderr
    assert needle.lower() in v.stderr.lower()
    ld = fleet(home, "load", str(f), check=False)
    assert ld.returncode == 1
    assert "nothing queued" in ld.stderr
    assert status(home) == []


def test_crashed_attempt_is_resumed_with_an_assess_first_prompt(tmp_path: Path) -> None:
    home, log = tmp_path / "home", tmp_path / "side.txt"
    cmd = (
        f'echo "start $FLEET_ATTEMPT" >> {log}; '
        'if [ "$FLEET_ATTEMPT" = 1 ]; then sleep 120; fi; '
        f'grep -q "Resuming after a crash" "$FLEET_PROMPT_FILE" && echo resumed >> {log}'
    )
    fleet(home, "add", "crash me", "--name", "c", "--cwd", str(tmp_path), "--command", cmd)
    run1 = fleet_bg(home, "run", log=tmp_path / "run1.log")
    wait_for(lambda: log.exists() and "start 1" in log.read_text(), 30, what="the first attempt")
    t = by_name(home)["c"]
    shim = shim_record(home / "tasks" / t["id"] / "attempts" / "1")
    # the whole machine "crashes": supervisor, shim and agent die without a word
    for pid in (run1.pid, shim["pid"], shim["agent_pid"]):
        os.kill(pid, signal.SIGKILL)
    run1.wait(timeout=10)
    wait_for(lambda: not pid_alive(shim["pid"]), 10, what="the shim to die")
    run2 = fleet_bg(home, "run", "--until-idle", log=tmp_path / "run2.log")
    assert run2.wait(timeout=60) == 0, (tmp_path / "run2.log").read_text()
    st = by_name(home)["c"]
    assert st["status"] == "done" and st["attempt"] == 2 and st["retries_used"] == 0
    assert log.read_text().split("\n")[:3] == ["start 1", "start 2", "resumed"]


def _proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        data = fh.read()
    return data[data.rfind(b")") + 2 :].split()[0].decode()


def test_pause_and_resume_a_running_agent_and_the_whole_fleet(tmp_path: Path) -> None:
    home = tmp_path / "home"
    fleet(home, "add", "@sim sleep=60", "--coder", "sim", "--name", "napper", "--cwd", str(tmp_path))
    run = fleet_bg(home, "run", log=tmp_path / "run.log")
    try:
        wait_for(lambda: by_name(home)["napper"]["status"] == "running", 30, what="napper running")
        t = by_name(home)["napper"]
        shim_file = home / "tasks" / t["id"] / "attempts" / "1" / "shim.json"
        wait_for(lambda: shim_file.exists() and "agent_pid" in shim_file.read_text(), 10, what="shim.json")
        agent = json.loads(shim_file.read_text())["agent_pid"]
        fleet(home, "pause", "napper")
        st = by_name(home)["napper"]
        assert st["status"] == "paused"
        wait_for(lambda: _proc_state(agent) == "T", 5, what="the agent SIGSTOPped")
        fleet(home, "resume", "napper")
        assert by_name(home)["napper"]["status"] == "running"
        wait_for(lambda: _proc_state(agent) != "T", 5, what="the agent SIGCONTinued")
        # the whole fleet: nothing new starts while paused, and it resumes by itself on resume --all
        fleet(home, "pause", "--all")
        fleet(home, "add", "@sim steps=1", "--coder", "sim", "--name", "later", "--cwd", str(tmp_path))
        wait_for(
            lambda: by_name(home)["later"]["waiting"] == "fleet paused", 10, what="later held by the pause"
        )
        assert by_name(home)["napper"]["status"] == "running"  # running agents continue
        fleet(home, "resume", "--all")
        wait_for(lambda: by_name(home)["later"]["status"] == "done", 30, what="later done after resume")
        fleet(home, "cancel", "napper")
        assert by_name(home)["napper"]["status"] == "cancelled"
        wait_for(lambda: not pid_alive(agent), 10, what="the cancelled agent to be gone")
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=30)


def test_logs_follow_streams_until_the_task_finishes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    fleet(
        home,
        "add",
        "@sim steps=4 pace=0.3\n@sim say=finished-here",
        "--coder",
        "sim",
        "--name",
        "chatty",
        "--cwd",
        str(tmp_path),
    )
    follower = subprocess.Popen(
        [sys.executable, "-m", "fleet_tui", "--home", str(home), "logs", "chatty", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run = fleet_bg(home, "run", "--until-idle", log=tmp_path / "run.log")
    assert run.wait(timeout=60) == 0
    out, err = follower.communicate(timeout=30)
    assert follower.returncode == 0, err
    lines = out.splitlines()
    assert any(" tool_call " in line for line in lines)
    assert any("finished-here" in line for line in lines)
    assert " result " in lines[-1] or " verify " in lines[-1], lines[-3:]


def test_a_task_that_always_crashes_is_parked_not_looped(tmp_path: Path) -> None:
    home = tmp_path / "home"
    # the agent kills its own shim: no exit status is ever written (a crash, which uses no retry)
    fleet(home, "add", "crash", "--name", "crasher", "--cwd", str(tmp_path), "--command", "kill -9 $PPID")
    run = fleet_bg(home, "run", "--until-idle", log=tmp_path / "run.log")
    assert run.wait(timeout=60) == 3, (tmp_path / "run.log").read_text()
    st = by_name(home)["crasher"]
    assert st["status"] == "needs_human", st
    assert st["reason"].startswith("crashed: 3 attempts in a row"), st["reason"]
    assert st["attempt"] == 3 and st["retries_used"] == 0


def _agents_overlapping(lines: list[str]) -> int:
    """The most agents live at once, from their ``start NAME`` / ``end NAME`` lines."""
    live: set[str] = set()
    most = 0
    for line in lines:
        word, name = line.split()
        if word == "start":
            live.add(name)
            most = max(most, len(live))
        elif word == "end":
            live.discard(name)
    return most


def test_a_slot_is_held_through_verification_and_freed_without_it(tmp_path: Path) -> None:
    """``max_concurrent`` counts agents: a task without verifiers frees its slot as its agent
    ends (the next one starts while its verdict is written), one with verifiers keeps it until
    they have run. Either way no two agents ever run at once under a cap of one."""
    home, log, tasks = tmp_path / "home", tmp_path / "log.txt", tmp_path / "tasks.toml"
    agent = f"echo start $FLEET_TASK_NAME >> {log}; sleep 0.2; echo end $FLEET_TASK_NAME >> {log}"
    lines = ["[defaults]", 'coder = "shell"', f'command = "{agent}"', ""]
    for i in range(4):
        lines += ["[[task]]", f'name = "plain{i}"', 'prompt = "x"', f"priority = {10 - i}", ""]
    lines += ["[[task]]", 'name = "checked"', 'prompt = "x"', "priority = 1", ""]
    lines += ["  [[task.verify]]", f'  run = "sleep 0.3; echo verified checked >> {log}"', ""]
    lines += ["[[task]]", 'name = "after"', 'prompt = "x"', "priority = 0", ""]
    tasks.write_text("\n".join(lines))
    fleet(home, "load", str(tasks))
    fleet(home, "run", "--until-idle", "--max-concurrent", "1", timeout=120)
    assert {t["name"]: t["status"] for t in status(home)} == dict.fromkeys(
        ["plain0", "plain1", "plain2", "plain3", "checked", "after"], "done"
    )
    got = log.read_text().split("\n")[:-1]
    assert _agents_overlapping(got) == 1
    # the verifier ran before the next agent started: its slot was held through it
    assert got.index("verified checked") < got.index("start after"), got


def test_verifiers_run_at_the_agents_niceness(tmp_path: Path) -> None:
    """A verifier is the agents' work (a test suite, a build): it runs at ``agent_nice`` like the
    agent, and where sessions are scheduling groups (autogroup) its session is niced as a group
    too. At niceness 0 a fleet's test suites took the CPU from the cockpit however nice the agents
    were."""
    home, out, tasks = tmp_path / "home", tmp_path / "nice", tmp_path / "tasks.toml"
    home.mkdir()
    (home / "config.toml").write_text(
        "max_load_per_core = 1000.0\nmem_floor_gib = 0.1\ndisk_floor_gib = 0.1\nagent_nice = 6\n"
    )
    group = "cat /proc/self/autogroup 2>/dev/null || echo none"
    probe = "awk '{print $19}' /proc/self/stat"
    tasks.write_text(
        "\n".join(
            [
                "[[task]]",
                'name = "checked"',
                'prompt = "x"',
                'coder = "shell"',
                f'command = "echo agent $({probe}) >> {out}"',
                "  [[task.verify]]",
                f'  run = "echo verifier $({probe}) $({group}) >> {out}"',
                "",
            ]
        )
    )
    fleet(home, "load", str(tasks))
    fleet(home, "run", "--until-idle", timeout=120)
    assert [t["status"] for t in status(home)] == ["done"]
    agent, verifier = out.read_text().splitlines()
    assert agent == "agent 6"
    words = verifier.split()
    assert words[:2] == ["verifier", "6"], verifier
    if Path("/proc/self/autogroup").exists():
        assert words[-2:] == ["nice", "6"], verifier
