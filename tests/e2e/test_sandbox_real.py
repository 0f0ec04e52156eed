"""The real Claude Code and Codex CLIs run whole tasks inside the bwrap sandbox (issue 18).

Driven like tests/e2e/test_real_agents.py — `fleet-tui add` / `run` / `questions` / `answer`
against a scripted fake model API on loopback, the CLIs configured through a temporary HOME —
with ``sandbox = "bwrap"`` in the fleet's config. Each run proves three things: the CLI works
with its state folders (it completes the task and writes in its working directory), the sandbox
is really there (the model's attempt to write into HOME or read ``~/.ssh`` fails), and ask_human
still reaches the store through the sandbox's broker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.fakeapi import Request, Text, ToolCall, Turn, require_program
from tests.fakeapi.anthropic import serve_anthropic, tool_results
from tests.fakeapi.openai_responses import function_outputs, serve_openai_responses
from tests.fakeapi.user_setups import codex_user

from fleet_tui.scheduler.sandbox import bwrap as sb
from helpers import by_name, fleet, fleet_bg, fleet_env, wait_for

pytestmark = [pytest.mark.realcli, pytest.mark.timeout(200)]

ANSWER = "Use PostgreSQL 16."


@pytest.fixture(scope="module", autouse=True)
def bwrap() -> None:
    ok, detail = sb.probe()
    if not ok:
        if os.environ.get("CI") == "true":
            pytest.fail(detail)
        pytest.skip(detail)


class Boxed:
    """A fleet home whose tasks run sandboxed, a scratch working directory and a scratch HOME."""

    def __init__(self, tmp_path: Path) -> None:
        self.home = tmp_path / "fleet"
        self.work = tmp_path / "work"
        self.work.mkdir()
        self.user_home = tmp_path / "userhome"
        (self.user_home / ".ssh").mkdir(parents=True)
        (self.user_home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
        self.log = tmp_path / "run.log"
        self.env = fleet_env(self.home, HOME=str(self.user_home))
        for key, value in (("sandbox", "bwrap"), ("retry_backoff_s", "0"), ("stall_min", "1.5"),
                           ("timeout_min", "3")):  # fmt: skip
            self("config", "set", key, value)

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return fleet(self.home, *args, env=self.env, timeout=60)

    def run_answering(self, name: str, question: str) -> None:
        """`run --until-idle` in the background; answer the task's question with `answer`."""
        run = fleet_bg(self.home, "run", "--until-idle", env=self.env, log=self.log)
        try:

            def pending() -> list[dict[str, Any]]:
                assert run.poll() is None, self.log.read_text()
                return [q for q in json.loads(self("questions", "--json").stdout) if q["task"] == name]

            (q,) = wait_for(pending, 90, interval=0.3, what=f"{name}'s question")
            assert q["text"] == question, q
            self("answer", q["id"], ANSWER)
            assert run.wait(timeout=120) == 0, self.log.read_text()
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()

    def done(self, name: str) -> dict[str, Any]:
        t = by_name(self.home)[name]
        att = self.home / "tasks" / t["id"] / "attempts" / str(t["attempt"])
        assert t["status"] == "done", (t, (att / "stderr.log").read_text(errors="replace")[-3000:])
        assert (att / "sandbox.json").exists()  # it did run sandboxed
        return t

    def events(self, name: str) -> list[dict[str, Any]]:
        out = self("logs", name, "--json").stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_claude_completes_a_task_in_the_sandbox_and_asks_a_human(tmp_path: Path) -> None:
    require_program("claude")
    box = Boxed(tmp_path)
    target, planted = box.work / "hello.txt", box.user_home / "planted.txt"
    script: list[Turn] = [
        ToolCall("Write", {"file_path": str(target), "content": "hi from the fake model\n"}),
        ToolCall("Write", {"file_path": str(planted), "content": "escaped\n"}),
        ToolCall("Bash", {"command": f"cat {box.user_home}/.ssh/id_* || echo NO-KEY"}),
        ToolCall("mcp__ask_human__ask_human", {"question": "Which database?"}),
        Text("Done; the answer was PostgreSQL 16."),
    ]
    with serve_anthropic(script) as (url, rec):
        box.env.update(ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY="sk-ant-fake", ANTHROPIC_AUTH_TOKEN="",
                       CLAUDE_CODE_OAUTH_TOKEN="")  # fmt: skip
        box("add", "Create hello.txt", "--coder", "claude", "--name", "boxed", "--cwd", str(box.work))
        box.run_answering("boxed", "Which database?")
        calls = rec.model_requests()
    t = box.done("boxed")
    adir = box.home / "tasks" / t["id"] / "attempts" / "1"
    assert "Traceback" not in (adir / "stderr.log").read_text()  # the ask_human server's is elsewhere
    assert target.read_text() == "hi from the fake model\n"
    assert not planted.exists()
    assert not (box.user_home / ".claude").exists()  # an API key: its state is in the run's folder
    results = [e for e in box.events("boxed") if e["kind"] == "tool_result"]
    assert len(results) == 4, results
    assert results[1]["is_error"], results[1]  # the write into HOME was refused
    assert "PRIVATE KEY" not in json.dumps(results[2]) and "NO-KEY" in (results[2].get("text") or "")
    assert results[3]["text"] == ANSWER
    assert any(ANSWER in json.dumps(tool_results(c)) for c in calls)


def test_codex_completes_a_task_in_the_sandbox_and_asks_a_human(tmp_path: Path) -> None:
    require_program("codex")
    box = Boxed(tmp_path)
    planted = box.user_home / "planted.txt"
    cmd = (
        f"echo ran-in-the-box > marker.txt; echo x > {planted} || echo HOME-DENIED; "
        f"cat {box.user_home}/.ssh/id_* || echo NO-KEY"
    )
    state = {"ran": False, "asked": False, "waits": 0}

    def turn(req: Request) -> ToolCall | Text:
        if not state["ran"]:
            state["ran"] = True
            if "exec_command" in req.tool_names():
                return ToolCall("exec_command", {"cmd": cmd})
            return ToolCall("shell", {"command": ["bash", "-lc", cmd]})
        if state["asked"]:
            return Text("Done; the answer was PostgreSQL 16.")
        if "mcp__ask_human" in req.tool_names():
            state["asked"] = True
            return ToolCall("ask_human", {"question": "Which database?"}, namespace="mcp__ask_human")
        state["waits"] += 1  # the MCP server is not listed yet: let it start, then ask
        if state["waits"] > 5:
            return Text("ask_human never appeared")
        return ToolCall("exec_command", {"cmd": "sleep 1"})

    with serve_openai_responses([(turn, None)]) as (url, rec):
        # configured as Codex users do: a custom provider in ~/.codex/config.toml; the task's
        # model is one Codex does not know, so it lists MCP tools directly (no tool_search)
        box.env.update(codex_user(box.user_home, url), OPENAI_API_KEY="", CODEX_API_KEY="",
                       OPENAI_BASE_URL="")  # fmt: skip
        box("add", "Write marker.txt", "--coder", "codex", "--name", "boxed", "--cwd", str(box.work),
            "--model", "fake-model")  # fmt: skip
        box.run_answering("boxed", "Which database?")
        calls = rec.model_requests()
    t = box.done("boxed")
    assert t["result_text"] == "Done; the answer was PostgreSQL 16."
    assert (box.work / "marker.txt").read_text() == "ran-in-the-box\n"
    assert not planted.exists()
    shell_out = json.dumps(function_outputs(calls[1]))
    assert "HOME-DENIED" in shell_out and "NO-KEY" in shell_out and "PRIVATE KEY" not in shell_out, shell_out
    assert any(ANSWER in json.dumps(function_outputs(c)) for c in calls)


def test_claude_reaches_only_its_allowlisted_api(tmp_path: Path) -> None:
    """``network = ["fakeapi.test"]``: Claude Code's API calls go through the sandbox's proxy to
    the fake API, named in this test's own hosts file (the engine runs in a mount namespace of the
    test's, made with bwrap); the same server by its address is refused, directly or by proxy."""
    require_program("claude")
    box = Boxed(tmp_path)
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n127.0.0.1 fakeapi.test\n")
    port: dict[str, str] = {}

    def probe(req: Request) -> ToolCall:
        target = f"http://127.0.0.1:{port['n']}/"
        return ToolCall(
            "Bash",
            {"command": f"curl -s -o /dev/null -w 'direct=%{{http_code}} ' --noproxy '*' {target}; "
                        f"curl -s -o /dev/null -w 'proxied=%{{http_code}}' {target}"},
        )  # fmt: skip

    with serve_anthropic([probe, Text("Tried both routes.")]) as (url, rec):
        port["n"] = url.rstrip("/").rsplit(":", 1)[1]
        box.env.update(ANTHROPIC_BASE_URL=f"http://fakeapi.test:{port['n']}", ANTHROPIC_API_KEY="sk-ant-fake",
                       ANTHROPIC_AUTH_TOKEN="", CLAUDE_CODE_OAUTH_TOKEN="")  # fmt: skip
        (tmp_path / "tasks.toml").write_text(
            '[[task]]\nname = "fenced"\ncoder = "claude"\ncwd = "work"\nprompt = "Try the network"\n'
            'network = ["fakeapi.test"]\n'
        )
        box("load", str(tmp_path / "tasks.toml"))
        own_hosts = ["bwrap", "--dev-bind", "/", "/", "--ro-bind", str(hosts), "/etc/hosts", "--"]
        run = subprocess.run(
            [*own_hosts, sys.executable, "-m", "fleet_tui", "--home", str(box.home), "run", "--until-idle"],
            env=box.env,
            capture_output=True,
            text=True,
            timeout=150,
        )
        assert run.returncode == 0, run.stderr
        calls = rec.model_requests()
    box.done("fenced")
    assert len(calls) == 2  # both model calls went through the proxy to fakeapi.test
    (result,) = [e for e in box.events("fenced") if e["kind"] == "tool_result"]
    assert (result.get("text") or "").strip() == "direct=000 proxied=403", result
