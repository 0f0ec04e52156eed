"""The shell coder: any command as an agent; its lines become text events, exit 0 is success."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from fleet_tui.coders.base import AttemptContext, get_coder
from fleet_tui.coders.shell import MAX_ENV_PROMPT, ShellCoder, ShellNormalizer
from fleet_tui.scheduler.model import Task, TaskSpec
from fleet_tui.scheduler.states import TaskStatus

pytestmark = pytest.mark.timeout(60)


def ctx_for(tmp_path: Path, command: str | None, prompt: str = "do the thing") -> AttemptContext:
    spec = TaskSpec(name="sh-task", prompt=prompt, coder="shell", command=command)
    task = Task(id="t-1", spec=spec, status=TaskStatus.RUNNING, attempt=2)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return AttemptContext(
        task=task,
        attempt=2,
        prompt=prompt,
        workdir=work,
        attempt_dir=tmp_path / "attempts" / "2",
        home=tmp_path,
    )


def run(coder: ShellCoder, ctx: AttemptContext) -> tuple[int, list[str]]:
    """Start the attempt the way the engine does: cwd = workdir, env merged, stdin piped."""
    coder.prepare(ctx)
    env = {"PATH": "/usr/bin:/bin", **coder.env(ctx)}
    res = subprocess.run(
        coder.argv(ctx), cwd=ctx.workdir, env=env, input=coder.stdin(ctx), capture_output=True, timeout=30
    )
    return res.returncode, res.stdout.decode("utf-8", "replace").splitlines()


def test_registered_and_available() -> None:
    coder = get_coder("shell")
    assert isinstance(coder, ShellCoder) and coder.name == "shell" and coder.program is None
    assert coder.available()[0] is True


def test_lines_become_text_events_and_json_is_kept(tmp_path: Path) -> None:
    coder = ShellCoder()
    cmd = (
        'printf "hello\\n{\\"k\\": [1, 2]}\\n"; pwd; cat; echo; echo "env:$FLEET_PROMPT"; '
        'cat "$FLEET_PROMPT_FILE"'
    )
    ctx = ctx_for(tmp_path, cmd, prompt="the prompt")
    code, lines = run(coder, ctx)
    assert code == 0
    assert lines == ["hello", '{"k": [1, 2]}', str(ctx.workdir), "the prompt", "env:the prompt", "the prompt"]
    norm = coder.normalizer("t-1", 2, start_seq=10)
    events = [e for i, line in enumerate(lines) for e in norm.feed(line, 100.0 + i)]
    assert [e.kind for e in events] == ["text"] * 6
    assert [e.seq for e in events] == list(range(10, 16))
    assert events[1].text == '{"k": [1, 2]}' and events[1].raw == {"k": [1, 2]}
    assert events[0].raw is None and all(e.task_id == "t-1" and e.attempt == 2 for e in events)
    out = norm.outcome(code)
    assert out.kind == "success" and out.claimed_success is True and out.result_text == "the prompt"


def test_nonzero_exit_is_a_failure(tmp_path: Path) -> None:
    coder = ShellCoder()
    code, lines = run(coder, ctx_for(tmp_path, "echo broken; exit 3"))
    norm = coder.normalizer("t-1", 2)
    for line in lines:
        norm.feed(line, 1.0)
    out = norm.outcome(code)
    assert (out.kind, out.detail, out.claimed_success) == ("failure", "exit 3", False)
    assert out.result_text == "broken"
    assert norm.outcome(None).kind == "failure"
    assert norm.outcome(-9).detail.startswith("exit -9")


@pytest.mark.parametrize("command", [None, "", "   "])
def test_missing_command_fails_fast_with_a_message(tmp_path: Path, command: str | None) -> None:
    coder = ShellCoder()
    ctx = ctx_for(tmp_path, command)
    code, lines = run(coder, ctx)
    assert code == 2
    assert len(lines) == 1 and "sh-task" in lines[0] and "no command" in lines[0]
    norm = coder.normalizer("t-1", 2)
    norm.feed(lines[0], 1.0)
    out = norm.outcome(code)
    assert out.kind == "failure" and out.detail == "exit 2" and "no command" in (out.result_text or "")


def test_env_and_prompt_file(tmp_path: Path) -> None:
    coder = ShellCoder()
    ctx = ctx_for(tmp_path, "true")
    ctx = AttemptContext(
        **{
            **ctx.__dict__,
            "mcp_command": ("fleet-tui", "mcp-ask-human"),
            "mcp_env": {"FLEET_HOME": "/h"},
            "model": "m1",
        }
    )
    coder.prepare(ctx)
    env = coder.env(ctx)
    assert env["FLEET_PROMPT"] == "do the thing" and env["FLEET_ATTEMPT"] == "2"
    assert env["FLEET_TASK_ID"] == "t-1" and env["FLEET_TASK_NAME"] == "sh-task"
    assert env["FLEET_MODEL"] == "m1" and env["FLEET_HOME"] == "/h"
    assert json.loads(env["FLEET_MCP_COMMAND"]) == ["fleet-tui", "mcp-ask-human"]
    assert Path(env["FLEET_PROMPT_FILE"]).read_text() == "do the thing"
    assert coder.stdin(ctx) == b"do the thing"


def test_a_huge_prompt_stays_out_of_the_environment(tmp_path: Path) -> None:
    coder = ShellCoder()
    big = "x" * (MAX_ENV_PROMPT + 1)
    ctx = ctx_for(tmp_path, 'test -z "$FLEET_PROMPT" && wc -c < "$FLEET_PROMPT_FILE" && wc -c', prompt=big)
    assert "FLEET_PROMPT" not in coder.env(ctx)
    code, lines = run(coder, ctx)
    assert code == 0 and [int(x) for x in lines] == [len(big), len(big)]


def test_normalizer_never_raises() -> None:
    norm = ShellNormalizer("t", 1)
    weird = [
        "",
        "   ",
        "[",
        "{}",
        "null",
        "\udcff\udcfe",
        "\x00\x1b[31m",
        "{" * 100_000,
        "[" * 5000 + "]" * 5000,
        "x" * 1_000_000,
    ]
    for line in weird:
        events = norm.feed(line, 0.0)
        assert all(e.kind == "text" for e in events)
    assert norm.feed("", 0.0) == [] and norm.feed("  ", 0.0) == []
    assert norm.poll(0.0) == []
