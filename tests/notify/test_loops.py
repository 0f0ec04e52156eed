"""Agents stuck in a loop are caught: the detector on its own, on a recorded Claude stream edited to
loop, and end to end with the sim agent repeating a tool call or asking an answered question again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.notify.receiver import Receiver

from fleet_tui.coders.claude import ClaudeCoder
from fleet_tui.scheduler.model import Event, Usage
from fleet_tui.scheduler.policy.loops import SEEN_LIMIT, LoopDetector, LoopLimits
from helpers import by_name, fleet, fleet_bg, quiet_home, wait_for

STREAMS = Path(__file__).resolve().parents[1] / "fixtures" / "streams"


def normalized(name: str) -> list[Event]:
    n = ClaudeCoder().normalizer("t1", 1)
    out: list[Event] = []
    for i, line in enumerate((STREAMS / name).read_text().splitlines()):
        out += n.feed(line, 1000.0 + i)
    return out


def first_reason(events: list[Event], limits: LoopLimits) -> tuple[int, str] | None:
    d = LoopDetector(limits)
    calls = 0
    for e in events:
        calls += e.kind == "tool_call"
        if reason := d.feed(e):
            return calls, reason
    return None


def test_a_recorded_claude_stream_edited_to_loop_is_caught_at_the_sixth_call() -> None:
    events = normalized("claude-real-local-2.1.332-bash-loop.jsonl")
    assert sum(e.kind == "tool_call" for e in events) == 6
    got = first_reason(events, LoopLimits(same_call=6))
    assert got == (
        6,
        'Bash "echo ran-by-fake-model > marker.txt && ls && git status --s…" 6 times in a row',
    )
    assert first_reason(events, LoopLimits(same_call=7)) is None
    assert first_reason(normalized("claude-real-local-2.1.332-bash.jsonl"), LoopLimits(same_call=2)) is None


def call(tool: str, arg: str, seq: int) -> Event:
    return Event("t", 1, seq, 0.0, "tool_call", tool=tool, tool_input={"command": arg})


def text(t: str, seq: int, out_tokens: int = 0) -> Event:
    return Event(
        "t", 1, seq, 0.0, "text", text=t, usage=Usage(output_tokens=out_tokens) if out_tokens else None
    )


def test_streaks_cycles_and_what_breaks_them() -> None:
    lim = LoopLimits(same_call=3, output_tokens=0)
    # text between identical calls does not break the streak
    evs = [
        call("Bash", "npm test", 0),
        text("again", 1),
        call("Bash", "npm test", 2),
        call("Bash", "npm test", 3),
    ]
    assert first_reason(evs, lim) == (3, 'Bash "npm test" 3 times in a row')
    # another call does: edit, test, edit, test is work, not a loop... unless the edit is the same each time
    work = [
        call("Edit", f"a.py v{i}", 2 * i) if i % 2 else call("Bash", "npm test", 2 * i) for i in range(10)
    ]
    assert first_reason(work, lim) is None
    cycle = [call("Read", "a.py", 0), call("Bash", "npm test", 1)] * 3
    assert first_reason(cycle, lim) == (6, 'Read "a.py" / Bash "npm test" repeated 3 times')


def test_output_tokens_without_anything_new() -> None:
    lim = LoopLimits(same_call=0, output_tokens=1000)
    fresh = [text(f"thought {i}", i, 400) for i in range(10)]
    assert first_reason(fresh, lim) is None
    stale = [text("Let me think about this again.", i, 400) for i in range(10)]
    assert first_reason(stale, lim) == (0, "1200 output tokens without new output")


# -- end to end ----------------------------------------------------------------------------------
def configure(home: Path, *lines: str) -> None:
    quiet_home(home)
    cfg = home / "config.toml"
    cfg.write_text(cfg.read_text() + 'notify_desktop = "off"\n' + "".join(line + "\n" for line in lines))


@pytest.mark.timeout(180)
def test_the_sim_agent_repeating_a_tool_call_is_parked_and_notified(tmp_path: Path) -> None:
    rx = Receiver()
    home = tmp_path / "home"
    configure(home, f'notify = ["{rx.url()}"]', "loop_same_call = 4")
    try:
        fleet(
            home,
            "add",
            "@sim repeat=30 pace=0.1",
            "--coder",
            "sim",
            "--name",
            "stuck",
            "--cwd",
            str(tmp_path),
        )
        assert fleet(home, "run", "--until-idle", timeout=150, check=False).returncode == 3  # parked
        task = by_name(home)["stuck"]
        assert task["status"] == "needs_human"
        assert task["reason"] == 'looping: Bash "npm test" 4 times in a row'
        logs = [json.loads(x) for x in fleet(home, "logs", "stuck", "--json").stdout.splitlines()]
        assert sum(e["kind"] == "tool_call" for e in logs) < 30  # stopped long before the end
        (post,) = wait_for(lambda: rx.titled("stuck needs you"), 30, 0.1, "the POST")
        assert 'looping: Bash "npm test" 4 times in a row' in post["message"]
    finally:
        rx.close()


@pytest.mark.timeout(180)
def test_asking_an_answered_question_again_is_caught(tmp_path: Path) -> None:
    home = tmp_path / "home"
    configure(home)
    prompt = (
        '@sim ask="Which database?" options=sqlite,postgres\n'
        '@sim ask="Which  database?" options=sqlite,postgres'
    )
    fleet(home, "add", prompt, "--coder", "sim", "--name", "forgetful", "--cwd", str(tmp_path))
    run = fleet_bg(home, "run", "--until-idle", log=tmp_path / "run.log")
    try:

        def pending() -> list[dict[str, Any]]:
            rows: list[dict[str, Any]] = json.loads(fleet(home, "questions", "--json").stdout)
            return rows

        (q,) = wait_for(pending, 90, 0.2, "the first question")
        fleet(home, "answer", q["id"], "sqlite")
        assert run.wait(120) in (0, 3), (tmp_path / "run.log").read_text()  # 3: a task parked
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
    task = by_name(home)["forgetful"]
    assert task["status"] == "needs_human"
    assert task["reason"] == 'looping: asked "Which database?" again after it was answered'


def test_an_attempts_watcher_remembers_a_bounded_number_of_texts() -> None:
    """What an attempt has said is remembered to tell new output from old, up to ``SEEN_LIMIT``
    texts: a loud attempt saying something new on every line no longer grows the watcher's
    memory without bound (14 MB an attempt at the old limit; 32 such attempts at once)."""
    d = LoopDetector(LoopLimits(output_tokens=1000))
    for i in range(SEEN_LIMIT + 50):
        assert d.feed(text(f"line {i}", i, out_tokens=1)) is None  # each one new
    seen = d._att[("t", 1)].seen_texts
    assert SEEN_LIMIT // 2 <= len(seen) <= SEEN_LIMIT
