"""An agent asks a person, end to end, through the real command line (DESIGN section 12).

The sim agent calls ``ask_human`` over the SDK's stdio client, on the server the engine names in
FLEET_MCP_COMMAND (``python -m fleet_tui mcp-ask-human``) with the engine's FLEET_* environment.
Everything runs as separate processes: ``fleet-tui add``, ``fleet-tui run --until-idle`` in the
background, ``fleet-tui questions --json`` / ``answer`` / ``kill`` from the test, like a person at
a shell. Synchronisation is by polling the CLI for a condition, never by sleeping.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from helpers import by_name, fleet, fleet_bg, wait_for

pytestmark = pytest.mark.timeout(180)

ASK = '@sim ask="Which license?" options=MIT,Apache\n@sim steps=1'


def questions(home: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(fleet(home, "questions", "--json").stdout)
    return rows


def logs(home: Path, task: str) -> list[dict[str, Any]]:
    out = fleet(home, "logs", task, "--json").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def start(tmp_path: Path, home: Path) -> subprocess.Popen[bytes]:
    fleet(home, "add", ASK, "--coder", "sim", "--name", "asker", "--cwd", str(tmp_path))
    return fleet_bg(home, "run", "--until-idle", log=tmp_path / "run.log")


def finish(run: subprocess.Popen[bytes], tmp_path: Path, expect: int = 0) -> None:
    try:
        code = run.wait(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
    assert code == expect, (tmp_path / "run.log").read_text()


def test_sim_agent_asks_and_the_cli_answer_reaches_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run = start(tmp_path, home)
    try:
        (q,) = wait_for(lambda: questions(home), 90, 0.2, "the sim agent's question")
        assert q["task"] == "asker" and q["attempt"] == 1
        assert q["text"] == "Which license?" and q["options"] == ["MIT", "Apache"]
        assert by_name(home)["asker"]["asking"] is True
        ans = fleet(home, "answer", q["id"], "MIT")
        assert q["id"] in ans.stdout
        again = fleet(home, "answer", q["id"], "Apache", check=False)
        assert again.returncode == 1 and "already answered" in again.stderr
    finally:
        finish(run, tmp_path)
    task = by_name(home)["asker"]
    assert task["status"] == "done", task
    assert "'MIT'" in (task["result_text"] or "")
    events = logs(home, "asker")
    calls = [e for e in events if e["kind"] == "tool_call" and e.get("tool") == "mcp__ask_human__ask_human"]
    assert len(calls) == 1
    assert calls[0]["tool_input"] == {"question": "Which license?", "options": ["MIT", "Apache"]}
    results = [e for e in events if e["kind"] == "tool_result" and e.get("tool_id") == calls[0]["tool_id"]]
    assert len(results) == 1 and "MIT" in (results[0]["text"] or "")
    assert not results[0].get("is_error")
    assert questions(home) == []


def test_unanswered_question_times_out_and_the_agent_goes_on(tmp_path: Path) -> None:
    home = tmp_path / "home"
    fleet(home, "config", "set", "question_timeout_min", "0.02")  # 1.2 s
    run = start(tmp_path, home)
    finish(run, tmp_path)
    task = by_name(home)["asker"]
    assert task["status"] == "done", task
    events = logs(home, "asker")
    (call,) = [e for e in events if e["kind"] == "tool_call" and e.get("tool") == "mcp__ask_human__ask_human"]
    (res,) = [e for e in events if e["kind"] == "tool_result" and e.get("tool_id") == call["tool_id"]]
    assert (res["text"] or "").startswith("No answer from a person within")
    assert questions(home) == []


def test_killing_the_task_cancels_its_question(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run = start(tmp_path, home)
    try:
        (q,) = wait_for(lambda: questions(home), 90, 0.2, "the sim agent's question")
        fleet(home, "kill", "asker")
        wait_for(lambda: questions(home) == [], 60, 0.2, "the question to leave the inbox")
    finally:
        finish(run, tmp_path, expect=3)  # the killed task needs a person
    task = by_name(home)["asker"]
    assert task["status"] == "needs_human" and "killed_by_user" in (task["reason"] or ""), task
    late = fleet(home, "answer", q["id"], "MIT", check=False)
    assert late.returncode == 1 and "cancelled" in late.stderr
