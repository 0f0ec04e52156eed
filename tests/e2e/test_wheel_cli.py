"""send, approve and edit through the real ``fleet-tui`` command, with the shell coder.

Why: these verbs change what a task is and what it does next, so they are tested the way a
person uses them: a subprocess per command, an engine run in between, and the record read back
(status --json, logs --json, the attempt's continue.json and prompt). The shell coder cannot
continue a session, so a follow-up or a retry falls back to a fresh session and must say so.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from fleet_tui.scheduler.store.opener import open_store
from helpers import by_name, fleet, fleet_bg, wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "fleet"
    fleet(h, "config", "set", "retry_backoff_s", "0")
    return h


def add_shell(home: Path, tmp_path: Path, name: str, *extra: str) -> None:
    # the agent keeps the prompt it got, so a test can read what each attempt was told
    cmd = f'cat "$FLEET_PROMPT_FILE" > {tmp_path}/prompt-{name}-$FLEET_ATTEMPT.txt; echo worked'
    fleet(home, "add", "do the thing", "--name", name, "--coder", "shell", "--command", cmd,
          "--cwd", str(tmp_path), *extra)  # fmt: skip


def run(home: Path) -> None:
    fleet(home, "run", "--until-idle", timeout=90, check=False)


def logs(home: Path, name: str) -> list[dict[str, Any]]:
    out = fleet(home, "logs", name, "--json").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def editor(tmp_path: Path, script: str) -> dict[str, str]:
    path = tmp_path / "editor.sh"
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, FLEET_HOME=str(tmp_path / "fleet"), EDITOR=str(path))
    env.pop("VISUAL", None)
    env.pop("FLEET_STORE", None)
    return env


def test_send_to_a_coder_that_cannot_resume_starts_fresh_and_says_so(home: Path, tmp_path: Path) -> None:
    add_shell(home, tmp_path, "job")
    run(home)
    assert by_name(home)["job"]["status"] == "done"
    out = fleet(home, "send", "job", "Also write the changelog entry.").stdout
    assert "follow-up queued" in out
    assert by_name(home)["job"]["status"] == "queued"
    run(home)
    t = by_name(home)["job"]
    assert t["status"] == "done" and t["attempt"] == 2, t
    prompt = (tmp_path / "prompt-job-2.txt").read_text()
    assert "do the thing" in prompt and "Also write the changelog entry." in prompt  # fresh: whole prompt
    notes = [e["text"] for e in logs(home, "job") if e["kind"] == "lifecycle" and e["attempt"] == 2]
    assert notes == ["fresh session: the shell coder cannot continue a session"], notes
    rec = json.loads((home / "tasks" / t["id"] / "attempts" / "2" / "continue.json").read_text())
    assert rec == {"continue": "auto", "turn": "followup", "continued": False, "session_id": None,
                   "note": notes[0]}  # fmt: skip
    # the first attempt had nothing to continue and nothing to say: no file
    assert not (home / "tasks" / t["id"] / "attempts" / "1" / "continue.json").exists()
    # the message was used once: a later retry does not repeat it
    store = open_store(None, str(home))
    try:
        assert store.get_setting(f"followup:{t['id']}") is None
    finally:
        store.close()


def test_send_refuses_an_empty_message(home: Path, tmp_path: Path) -> None:
    add_shell(home, tmp_path, "job")
    p = fleet(home, "send", "job", "  ", check=False)
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "empty" in p.stderr, p.stderr


def test_approve_a_parked_task_records_the_person(home: Path, tmp_path: Path) -> None:
    add_shell(home, tmp_path, "strict", "--verify", "false", "--max-retries", "0")
    fleet(home, "add", "after it", "--name", "next", "--coder", "shell", "--command", "true",
          "--cwd", str(tmp_path), "--after", "strict")  # fmt: skip
    p = fleet(home, "approve", "strict", check=False)
    assert p.returncode == 1 and "only a parked task" in p.stderr and p.stderr.count("\n") == 1, p.stderr
    run(home)
    tasks = by_name(home)
    assert tasks["strict"]["status"] == "needs_human" and tasks["next"]["status"] == "needs_human", tasks
    out = fleet(home, "approve", "strict").stdout
    assert "done (approved by " in out
    t = by_name(home)["strict"]
    assert t["status"] == "done" and t["reason"].startswith("approved_by:"), t
    store = open_store(None, str(home))
    try:
        last = store.transitions(t["id"])[-1]
        assert (last.src, last.dst) == ("needs_human", "done") and last.reason == t["reason"]
        attempt = store.get_attempt(t["id"], 1)
        assert attempt is not None and "approved by" in (attempt.verify_output or "")
    finally:
        store.close()
    assert by_name(home)["next"]["status"] == "queued"  # its dependent may go on now
    run(home)
    assert by_name(home)["next"]["status"] == "done"


def test_edit_a_queued_task_through_the_editor(home: Path, tmp_path: Path) -> None:
    add_shell(home, tmp_path, "job")
    env = editor(
        tmp_path, """sed -i 's/^prompt = .*/prompt = "do it better"/; s/^priority = .*/priority = 7/' "$1\""""
    )
    out = fleet(home, "edit", "job", env=env).stdout
    assert out.strip() == "job: edited"
    t = by_name(home)["job"]
    assert t["priority"] == 7
    run(home)
    assert by_name(home)["job"]["status"] == "done"
    assert (tmp_path / "prompt-job-1.txt").read_text().startswith("do it better")


def test_edit_refuses_bad_values_names_and_non_queued_tasks(home: Path, tmp_path: Path) -> None:
    add_shell(home, tmp_path, "job")
    bad = editor(tmp_path, """sed -i 's/^priority = .*/priority = "high"/' "$1\"""")
    p = fleet(home, "edit", "job", env=bad, check=False)
    assert p.returncode == 1 and ".toml:" in p.stderr and "priority must be an integer" in p.stderr, p.stderr
    assert "nothing changed" in p.stderr
    rename = editor(tmp_path, """sed -i 's/^name = .*/name = "other"/' "$1\"""")
    p = fleet(home, "edit", "job", env=rename, check=False)
    assert p.returncode == 1 and "name cannot change" in p.stderr, p.stderr
    assert by_name(home)["job"]["priority"] == 0
    run(home)
    p = fleet(home, "edit", "job", env=bad, check=False)
    assert p.returncode == 1 and "job is done: only a queued task can be edited" in p.stderr, p.stderr


def test_send_to_a_running_task_stops_its_agent_and_continues(home: Path, tmp_path: Path) -> None:
    keep = f'cat "$FLEET_PROMPT_FILE" > {tmp_path}/prompt-$FLEET_ATTEMPT.txt'
    cmd = f'[ "$FLEET_ATTEMPT" = 1 ] && sleep 300; {keep}'
    fleet(
        home,
        "add",
        "long work",
        "--name",
        "long",
        "--coder",
        "shell",
        "--command",
        cmd,
        "--cwd",
        str(tmp_path),
    )
    engine = fleet_bg(home, "run", "--until-idle", log=tmp_path / "run.log")
    try:
        wait_for(lambda: by_name(home)["long"]["status"] == "running", timeout=60, what="running")
        out = fleet(home, "send", "long", "Stop that and summarise.").stdout
        assert "agent stopped; follow-up queued" in out, out
        wait_for(lambda: by_name(home)["long"]["status"] == "done", timeout=60, what="second attempt done")
    finally:
        engine.kill()
        engine.wait(timeout=30)
    assert "Stop that and summarise." in (tmp_path / "prompt-2.txt").read_text()
    store = open_store(None, str(home))
    try:
        attempt = store.get_attempt(by_name(home)["long"]["id"], 1)
        assert attempt is not None and attempt.outcome == "killed"
    finally:
        store.close()


def attempt_record(home: Path, name: str, n: int) -> Any:
    store = open_store(None, str(home))
    try:
        return store.get_attempt(by_name(home)[name]["id"], n)
    finally:
        store.close()


def test_send_to_a_running_agent_waits_for_its_turn_boundary(home: Path, tmp_path: Path) -> None:
    # the agent is inside a tool call (it waits for a file); the follow-up must not cut it off:
    # the agent is stopped once that call's result is in, not before
    go = tmp_path / "go"
    prompt = f"@sim wait-file={go}\n@sim say=finished"
    fleet(home, "add", prompt, "--name", "turn", "--coder", "sim", "--cwd", str(tmp_path))
    engine = fleet_bg(home, "run", "--until-idle", log=tmp_path / "run.log")
    try:
        wait_for(
            lambda: any(e["kind"] == "tool_call" for e in logs(home, "turn")), timeout=60, what="tool call"
        )
        out = fleet(home, "send", "turn", "Then write the summary.").stdout
        assert "stops at its next turn boundary" in out, out
        assert by_name(home)["turn"]["status"] == "running"  # the call it is in goes on
        go.write_text("")
        wait_for(lambda: by_name(home)["turn"]["status"] == "done", timeout=60, what="second attempt done")
    finally:
        engine.kill()
        engine.wait(timeout=30)
    first = attempt_record(home, "turn", 1)
    assert first.outcome == "killed"
    assert first.detail.startswith("follow-up: stopped at a turn boundary (after the result of"), first.detail
    kinds = [e["kind"] for e in logs(home, "turn") if e.get("attempt") == 1]
    assert "tool_result" in kinds, kinds  # the call it was in finished first
    prompt2 = (home / "tasks" / by_name(home)["turn"]["id"] / "attempts" / "2" / "prompt.txt").read_text()
    assert "Then write the summary." in prompt2


def test_send_stops_an_agent_anyway_after_the_grace_and_says_so(home: Path, tmp_path: Path) -> None:
    fleet(home, "config", "set", "followup_grace_s", "1")
    go = tmp_path / "go"
    prompt = f"@sim wait-file={go}\n@sim say=finished"
    fleet(home, "add", prompt, "--name", "stuck", "--coder", "sim", "--cwd", str(tmp_path))
    engine = fleet_bg(home, "run", "--until-idle", log=tmp_path / "run.log")
    try:
        wait_for(
            lambda: any(e["kind"] == "tool_call" for e in logs(home, "stuck")), timeout=60, what="tool call"
        )
        out = fleet(home, "send", "stuck", "Give up on that file.").stdout
        assert "at most 1 s" in out, out
        wait_for(
            lambda: (a := attempt_record(home, "stuck", 1)) is not None and a.outcome == "killed",
            timeout=60,
            what="first attempt stopped",
        )
        go.write_text("")  # the second attempt (a fresh sim session) gets past the wait
        wait_for(lambda: by_name(home)["stuck"]["status"] == "done", timeout=60, what="second attempt done")
    finally:
        engine.kill()
        engine.wait(timeout=30)
    detail = attempt_record(home, "stuck", 1).detail
    assert detail == "follow-up: no turn boundary within 1 s (followup_grace_s); stopped anyway", detail


def test_a_follow_up_waiting_for_a_turn_survives_its_engine(home: Path, tmp_path: Path) -> None:
    # the engine that was asked to stop the agent at its next turn boundary dies (kill -9) before
    # the boundary comes; the engine that adopts the agent keeps waiting for it, then delivers
    go = tmp_path / "go"
    prompt = f"@sim wait-file={go}\n@sim say=finished"
    fleet(home, "add", prompt, "--name", "turn", "--coder", "sim", "--cwd", str(tmp_path))
    first = fleet_bg(home, "run", "--until-idle", log=tmp_path / "run1.log")
    second = None
    try:
        wait_for(
            lambda: any(e["kind"] == "tool_call" for e in logs(home, "turn")), timeout=60, what="tool call"
        )
        assert "stops at its next turn boundary" in fleet(home, "send", "turn", "Then summarise.").stdout
        first.kill()
        first.wait(timeout=30)
        second = fleet_bg(home, "run", "--until-idle", log=tmp_path / "run2.log")
        go.write_text("")
        wait_for(lambda: by_name(home)["turn"]["status"] == "done", timeout=60, what="second attempt done")
    finally:
        for p in (first, second):
            if p is not None:
                p.kill()
                p.wait(timeout=30)
    detail = attempt_record(home, "turn", 1).detail
    assert detail.startswith("follow-up: stopped at a turn boundary"), detail
    assert by_name(home)["turn"]["attempt"] == 2
