"""Taking the wheel with the real claude, codex, opencode and gemini programs against the fake APIs.

Why: continuing an agent's own conversation is only real when the CLI itself resumes its
session: these tests drive ``fleet-tui run`` / ``send`` end to end and look at what the CLI sent
the (fake) model: the second request of the task carries the first turn's messages and the new
turn (the verifier's failure, or the person's follow-up), and the session id is the same. A
follow-up for a running claude waits for the end of the tool call it is in; a CLI whose session
is gone falls back to a fresh one and says so. Each CLI is configured as its users do (OpenCode
through its opencode.json provider baseURL).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.test_real_agents import Fleet, claude_env, codex_env
from tests.fakeapi import Request, Text, ToolCall, require_program
from tests.fakeapi.anthropic import serve_anthropic
from tests.fakeapi.openai_responses import serve_openai_responses
from tests.fakeapi.user_setups import OPENCODE_MODEL, SCRUB, opencode_user

from fleet_tui.scheduler.store.opener import open_store
from helpers import wait_for

pytestmark = [pytest.mark.realcli, pytest.mark.timeout(150)]


@pytest.fixture
def fl(tmp_path: Path) -> Fleet:
    return Fleet(tmp_path)


def fails_once(tmp_path: Path) -> str:
    flag = tmp_path / "verified-once"
    return f"test -e {flag} || {{ touch {flag}; echo VERIFY-SAYS-MISSING-DOCSTRING; exit 1; }}"


def sessions(fl: Fleet, name: str) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for e in fl.logs_json(name):
        if e.get("session_id") and e["kind"] != "lifecycle":
            out.setdefault(e["attempt"], set()).add(e["session_id"])
    return out


def lifecycle(fl: Fleet, name: str, attempt: int) -> list[str]:
    return [e["text"] for e in fl.logs_json(name) if e["kind"] == "lifecycle" and e["attempt"] == attempt]


def continue_record(fl: Fleet, name: str, attempt: int) -> dict[str, Any]:
    t = fl.task(name)
    data: dict[str, Any] = json.loads(
        (fl.home / "tasks" / t["id"] / "attempts" / str(attempt) / "continue.json").read_text()
    )
    return data


def anthropic_texts(req: Request) -> list[str]:
    """The text of each message of the request (user and assistant), in order."""
    out: list[str] = []
    for m in req.body.get("messages", []):
        content = m.get("content")
        if isinstance(content, str):
            out.append(content)
        else:
            blocks = [b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"]
            out.append("\n".join(blocks))
    return out


def responses_texts(req: Request) -> list[str]:
    out: list[str] = []
    for item in req.body.get("input", []):
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out += [c.get("text", "") for c in content if isinstance(c, dict)]
    return out


# -- Claude Code ---------------------------------------------------------------------------------


def test_claude_retry_continues_the_same_session(fl: Fleet, tmp_path: Path) -> None:
    require_program("claude")
    with serve_anthropic([Text("First try: done."), Text("Added the docstring.")]) as (url, rec):
        claude_env(fl, url)
        fl.add("claude", "doc", "Write a module docstring", "--verify", fails_once(tmp_path))
        fl.run_until_idle()
        calls = rec.model_requests()
    t = fl.task("doc")
    assert t["status"] == "done" and t["attempt"] == 2, (t, fl.stderr_of("doc"))
    assert len(calls) == 2, [c.body for c in calls]
    second = anthropic_texts(calls[1])
    assert any("Write a module docstring" in x for x in second), second  # the first turn's messages
    assert any("First try: done." in x for x in second[:-1]), second
    assert "VERIFY-SAYS-MISSING-DOCSTRING" in second[-1], second  # the failure is the new turn
    assert "Write a module docstring" not in second[-1]
    s = sessions(fl, "doc")
    assert len(s[1]) == 1 and s[1] == s[2], s
    rec2 = continue_record(fl, "doc", 2)
    assert rec2["continued"] and rec2["session_id"] in s[1] and rec2["turn"] == "retry", rec2
    assert any("continuing session" in x for x in lifecycle(fl, "doc", 2))


def test_claude_send_on_a_done_task_continues_with_the_message(fl: Fleet) -> None:
    require_program("claude")
    with serve_anthropic([Text("Done the first part."), Text("Renamed it.")]) as (url, rec):
        claude_env(fl, url)
        fl.add("claude", "part", "Write part one")
        fl.run_until_idle()
        assert fl.task("part")["status"] == "done", fl.stderr_of("part")
        out = fl("send", "part", "Now rename foo to bar, please").stdout
        assert "follow-up queued" in out, out
        assert fl.task("part")["status"] == "queued"
        fl.run_until_idle()
        calls = rec.model_requests()
    t = fl.task("part")
    assert t["status"] == "done" and t["attempt"] == 2 and t["result_text"] == "Renamed it.", t
    second = anthropic_texts(calls[1])
    assert any("Done the first part." in x for x in second[:-1]), second
    assert any("Write part one" in x for x in second[:-1]), second
    assert "Now rename foo to bar, please" in second[-1], second
    s = sessions(fl, "part")
    assert s[1] == s[2], s
    assert continue_record(fl, "part", 2)["turn"] == "followup"


def test_claude_fresh_when_the_task_says_so(fl: Fleet, tmp_path: Path) -> None:
    require_program("claude")
    tasks = tmp_path / "tasks.toml"
    tasks.write_text(
        f'[[task]]\nname = "fresh"\ncwd = "{fl.work}"\ncoder = "claude"\nprompt = "Do it"\n'
        f'continue = "fresh"\n[[task.verify]]\nrun = "{fails_once(tmp_path)}"\n'
    )
    with serve_anthropic([Text("FIRST-ANSWER"), Text("SECOND-ANSWER")]) as (url, rec):
        claude_env(fl, url)
        fl("load", str(tasks))
        fl.run_until_idle()
        calls = rec.model_requests()
    assert fl.task("fresh")["status"] == "done"
    second = anthropic_texts(calls[1])
    assert not any("FIRST-ANSWER" in x for x in second), second
    assert any("VERIFY-SAYS-MISSING-DOCSTRING" in x for x in second), second
    s = sessions(fl, "fresh")
    assert s[1] != s[2], s
    assert lifecycle(fl, "fresh", 2) == ["fresh session (continue = fresh)"]


def test_claude_send_to_a_running_agent_stops_it_after_its_tool_call(fl: Fleet, tmp_path: Path) -> None:
    # the agent is inside a Bash call when the follow-up comes: it is stopped once that call's
    # result is in, and the next attempt continues the session (tool call and result included)
    require_program("claude")
    go = tmp_path / "go"
    wait = f"while [ ! -e {go} ]; do sleep 0.1; done; echo WAITED-FOR-GO"
    script: list[Text | ToolCall] = [
        ToolCall("Bash", {"command": wait}, text="Waiting."),
        Text("Done."),
        Text("Done."),
    ]
    with serve_anthropic(script) as (url, rec):
        claude_env(fl, url)
        fl.add("claude", "busy", "Wait for the go file")
        engine = fl.run_bg()
        try:
            wait_for(lambda: any(e["kind"] == "tool_call" for e in fl.logs_json("busy")), 90, what="Bash")
            out = fl("send", "busy", "Then say which file you waited for").stdout
            assert "stops at its next turn boundary" in out, out
            go.write_text("")
            wait_for(lambda: fl.task("busy")["status"] == "done", 120, what="the follow-up's attempt done")
        finally:
            engine.kill()
            engine.wait(timeout=30)
        calls = rec.model_requests()
    t = fl.task("busy")
    assert t["attempt"] == 2, (t, fl.run_log())
    first = [e for e in fl.logs_json("busy") if e["attempt"] == 1]
    assert any(e["kind"] == "tool_result" and "WAITED-FOR-GO" in (e.get("text") or "") for e in first)
    last = calls[-1].body["messages"]
    texts = [json.dumps(m.get("content")) for m in last]
    assert any("WAITED-FOR-GO" in x for x in texts[:-1]), texts  # the call's result, kept
    assert "Then say which file you waited for" in texts[-1], texts
    s = sessions(fl, "busy")
    assert s[1] == s[2], s
    assert continue_record(fl, "busy", 2)["turn"] == "followup"
    store = open_store(None, str(fl.home))
    try:
        first_attempt = store.get_attempt(t["id"], 1)
    finally:
        store.close()
    assert first_attempt is not None
    detail = first_attempt.detail
    assert detail == "follow-up: stopped at a turn boundary (after the result of Bash)", detail


# -- Codex -----------------------------------------------------------------------------------------


def test_codex_retry_continues_the_same_session(fl: Fleet, tmp_path: Path) -> None:
    require_program("codex")
    with serve_openai_responses([Text("First try: done."), Text("Added the docstring.")]) as (url, rec):
        codex_env(fl, url)
        fl.add(
            "codex",
            "doc",
            "Write a module docstring",
            "--verify",
            fails_once(tmp_path),
            "--model",
            "fake-model",
        )
        fl.run_until_idle()
        calls = rec.model_requests()
    t = fl.task("doc")
    assert t["status"] == "done" and t["attempt"] == 2, (t, fl.stderr_of("doc"))
    assert len(calls) == 2, [c.body for c in calls]
    second = responses_texts(calls[1])
    assert any("Write a module docstring" in x for x in second), second
    assert "First try: done." in second, second
    assert "VERIFY-SAYS-MISSING-DOCSTRING" in second[-1], second
    s = sessions(fl, "doc")
    assert len(s[1]) == 1 and s[1] == s[2], s
    assert continue_record(fl, "doc", 2)["continued"]


def test_codex_send_on_a_done_task_continues_with_the_message(fl: Fleet) -> None:
    require_program("codex")
    with serve_openai_responses([Text("Done the first part."), Text("Renamed it.")]) as (url, rec):
        codex_env(fl, url)
        fl.add("codex", "part", "Write part one", "--model", "fake-model")
        fl.run_until_idle()
        assert fl.task("part")["status"] == "done", fl.stderr_of("part")
        fl("send", "part", "Now rename foo to bar, please")
        fl.run_until_idle()
        calls = rec.model_requests()
    t = fl.task("part")
    assert t["status"] == "done" and t["attempt"] == 2, (t, fl.stderr_of("part"))
    second = responses_texts(calls[1])
    assert "Done the first part." in second and "Now rename foo to bar, please" in second[-1], second
    s = sessions(fl, "part")
    assert s[1] == s[2], s


# -- OpenCode --------------------------------------------------------------------------------------


def opencode_setup(fl: Fleet, url: str) -> None:
    """An OpenCode user whose anthropic provider's baseURL is the fake API (their opencode.json)."""
    for var in SCRUB:
        fl.env.pop(var, None)
    fl.env.update(opencode_user(fl.user_home, url + "/v1"))


def test_opencode_retry_continues_the_same_session(fl: Fleet, tmp_path: Path) -> None:
    require_program("opencode")
    with serve_anthropic([Text("First try: done."), Text("Added the docstring.")]) as (url, rec):
        opencode_setup(fl, url)
        fl.add("opencode", "doc", "Write a module docstring", "--verify", fails_once(tmp_path),
               "--model", OPENCODE_MODEL)  # fmt: skip
        fl.run_until_idle()
        calls = rec.model_requests()
    t = fl.task("doc")
    assert t["status"] == "done" and t["attempt"] == 2, (t, fl.stderr_of("doc"))
    assert len(calls) == 2, [c.body for c in calls]
    second = anthropic_texts(calls[-1])
    assert any("Write a module docstring" in x for x in second[:-1]), second  # the first turn
    assert any("First try: done." in x for x in second[:-1]), second
    assert "VERIFY-SAYS-MISSING-DOCSTRING" in second[-1], second  # the failure is the new turn
    assert "Write a module docstring" not in second[-1]
    s = sessions(fl, "doc")
    assert len(s[1]) == 1 and s[1] == s[2], s
    rec2 = continue_record(fl, "doc", 2)
    assert rec2["continued"] and rec2["session_id"] in s[1] and rec2["turn"] == "retry", rec2


def test_opencode_send_on_a_done_task_continues_with_the_message(fl: Fleet) -> None:
    require_program("opencode")
    with serve_anthropic([Text("Done the first part."), Text("Renamed it.")]) as (url, rec):
        opencode_setup(fl, url)
        fl.add("opencode", "part", "Write part one", "--model", OPENCODE_MODEL)
        fl.run_until_idle()
        assert fl.task("part")["status"] == "done", fl.stderr_of("part")
        fl("send", "part", "Now rename foo to bar, please")
        fl.run_until_idle()
        calls = rec.model_requests()
    t = fl.task("part")
    assert t["status"] == "done" and t["attempt"] == 2, (t, fl.stderr_of("part"))
    second = anthropic_texts(calls[-1])
    assert any("Done the first part." in x for x in second[:-1]), second
    assert "Now rename foo to bar, please" in second[-1], second
    s = sessions(fl, "part")
    assert s[1] == s[2], s


def test_opencode_falls_back_to_fresh_when_its_session_is_gone(fl: Fleet, tmp_path: Path) -> None:
    require_program("opencode")
    with serve_anthropic([Text("FIRST-ANSWER"), Text("SECOND-ANSWER")]) as (url, rec):
        opencode_setup(fl, url)
        fl.add("opencode", "gone", "Write a module docstring", "--model", OPENCODE_MODEL)
        fl.run_until_idle()
        t = fl.task("gone")
        assert t["status"] == "done", fl.stderr_of("gone")
        # the session's database went away with the first run's directory (cleaned by hand)
        data = fl.home / "tasks" / t["id"] / "attempts" / "1" / "opencode" / "xdg" / "data"
        shutil.rmtree(data)
        fl("send", "gone", "One more thing")
        fl.run_until_idle()
        calls = rec.model_requests()
    assert fl.task("gone")["status"] == "done", fl.stderr_of("gone")
    second = anthropic_texts(calls[-1])
    assert not any("FIRST-ANSWER" in x for x in second), second
    assert any("One more thing" in x for x in second), second
    rec2 = continue_record(fl, "gone", 2)
    assert not rec2["continued"] and "database is gone" in rec2["note"], rec2
    assert any("fresh session: opencode session" in x for x in lifecycle(fl, "gone", 2))


# -- Gemini CLI ------------------------------------------------------------------------------------


def gemini_texts(req: Request) -> list[str]:
    out: list[str] = []
    for c in req.body.get("contents", []):
        out.append("\n".join(p.get("text", "") for p in c.get("parts", []) if isinstance(p, dict)))
    return out


def test_gemini_retry_continues_the_same_session(fl: Fleet, tmp_path: Path) -> None:
    require_program("gemini")
    from tests.fakeapi.gemini import serve_gemini

    with serve_gemini([Text("First try: done."), Text("Added the docstring.")]) as (url, rec):
        fl.env.update(
            GEMINI_API_KEY="fake-key", GEMINI_CLI_HOME=str(fl.user_home), GOOGLE_GEMINI_BASE_URL=url
        )
        for var in ("GOOGLE_GENAI_USE_GCA", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_API_KEY"):
            fl.env.pop(var, None)
        fl.add("gemini", "doc", "Write a module docstring", "--verify", fails_once(tmp_path),
               "--model", "gemini-2.5-flash")  # fmt: skip
        fl.run_until_idle()
        calls = rec.model_requests()
    t = fl.task("doc")
    assert t["status"] == "done" and t["attempt"] == 2, (t, fl.stderr_of("doc"))
    second = gemini_texts(calls[-1])
    assert any("Write a module docstring" in x for x in second[:-1]), second
    assert any("First try: done." in x for x in second[:-1]), second
    assert "VERIFY-SAYS-MISSING-DOCSTRING" in second[-1], second
    s = sessions(fl, "doc")
    assert len(s[1]) == 1 and s[1] == s[2], s
