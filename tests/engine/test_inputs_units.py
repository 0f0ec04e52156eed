"""Issue 12, points 16 and 21 at the unit level: a shim job keeps every value in its place, and a
huge tool input is capped in its event (the whole line stays in stdout.jsonl)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fleet_tui.coders import base
from fleet_tui.coders.claude import ClaudeNormalizer
from fleet_tui.coders.shell import ShellNormalizer
from fleet_tui.report import event_json
from fleet_tui.scheduler.model import Event, Task, TaskSpec, Usage
from fleet_tui.scheduler.policy.prompt import DependencyResult, PromptContext, build_prompt
from fleet_tui.scheduler.procs import shim
from fleet_tui.scheduler.states import TaskStatus
from fleet_tui.scheduler.store.protocol import event_from_row, event_payload

EVENT_FIELD_CAP = 256 * 1024  # coders.base.EVENT_FIELD_CAP


def _job(argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    r, w = os.pipe()
    os.write(w, shim.encode_job(argv, env))
    os.close(w)
    try:
        return shim.read_job(r)
    finally:
        os.close(r)


def test_a_nul_in_a_value_cannot_inject_a_variable() -> None:
    argv = ["agent", "-p", "hi\0EVIL=1", "", "x\ny"]
    env = {"FLEET_PROMPT": "x\0LD_PRELOAD=/tmp/evil.so", "A": "1", "EMPTY": "", "NL": "a\nb"}
    got_argv, got_env = _job(argv, env)
    assert got_argv == argv
    assert got_env == env and "LD_PRELOAD" not in got_env


def test_a_jobs_variables_encoded_once_each_still_carry_every_change() -> None:
    """The engine encodes each (name, value) of an agent's environment once: a value that changes
    is encoded anew (never the name's old value), and what is kept stays bounded."""
    shim._pairs.clear()
    assert _job(["agent"], {"A": "1", "NL": "x\ny", "NUL": "p\0Q=1"}) == (
        ["agent"],
        {"A": "1", "NL": "x\ny", "NUL": "p\0Q=1"},
    )
    assert ("A", "1") in shim._pairs
    assert _job(["agent"], {"A": "2", "NL": "x\ny"}) == (["agent"], {"A": "2", "NL": "x\ny"})
    for i in range(shim._PAIRS_MOST + 50):  # a task's own values, one per attempt
        assert _job([], {"FLEET_TASK_ID": f"t-{i}"})[1] == {"FLEET_TASK_ID": f"t-{i}"}
    assert len(shim._pairs) <= shim._PAIRS_MOST + 1


def test_a_warm_shim_runs_exactly_the_job(tmp_path: Path) -> None:
    """Through a real warm shim: a NUL inside a variable's value cannot become a variable of its
    own; the shim refuses to start the agent (it could only be cut) and says why."""
    out = tmp_path / "env.json"
    argv = [sys.executable, "-c", f"import json, os; json.dump(dict(os.environ), open({str(out)!r}, 'w'))"]
    args = ["--dir", str(tmp_path), "--cwd", str(tmp_path), "--", *argv]
    env = {"PATH": os.environ["PATH"], "FLEET_PROMPT": "p\0INJECTED=1", "B": "2"}
    p = subprocess.Popen([sys.executable, shim.__file__, "--warm"], stdin=subprocess.PIPE)
    assert p.stdin is not None
    p.stdin.write(shim.encode_job(args, env))
    p.stdin.close()
    p.wait(timeout=30)  # a warm shim runs the agent itself: exit.json is written before it ends
    assert not out.exists()  # the agent never ran with INJECTED=1
    assert json.loads((tmp_path / "exit.json").read_text())["reason"] == "spawn_failed"
    assert "null byte" in (tmp_path / "stderr.log").read_text()


def test_a_nul_from_a_dependency_never_reaches_the_agent() -> None:
    spec = TaskSpec(name="n", prompt="do it")
    task = Task(id="t-1", spec=spec, status=TaskStatus.RUNNING)
    prompt = build_prompt(
        PromptContext(
            task=task, attempt=1, workdir="/w", dependencies=[DependencyResult("dep", "ok\0EVIL=1", None)]
        )
    )
    assert "\0" not in prompt and "ok\u2400EVIL=1" in prompt


def test_a_huge_tool_input_is_capped_in_its_event() -> None:
    big = "x" * (30 * 1024 * 1024)
    line = json.dumps(
        {
            "type": "assistant",
            "message": {
                "id": "m1",
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "tu1", "name": "Write", "input": {"path": "a", "content": big}}
                ],
            },
        }
    )
    evs = ClaudeNormalizer("t", 1).feed(line, 1.0)
    calls = [e for e in evs if e.kind == "tool_call"]
    assert calls and calls[0].tool == "Write"
    size = len(json.dumps(calls[0].tool_input)) + len(json.dumps(calls[0].raw, default=str))
    assert size < EVENT_FIELD_CAP + 1024
    assert "more characters in stdout.jsonl" in str(calls[0].tool_input)
    result = json.dumps(
        {
            "type": "user",
            "message": {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": big}],
            },
        }
    )
    for e in ClaudeNormalizer("t", 1).feed(result, 2.0):
        assert len(e.text or "") < EVENT_FIELD_CAP + 100
        assert len(json.dumps(e.raw, default=str)) < EVENT_FIELD_CAP + 1024


PREPARE = """
import sys
from pathlib import Path
from fleet_tui.coders.base import AttemptContext, get_coder
from fleet_tui.scheduler.model import Task, TaskSpec
from fleet_tui.scheduler.states import TaskStatus

tmp = Path(sys.argv[2])
task = Task(id="t1", spec=TaskSpec(name="t", prompt="p"), status=TaskStatus.RUNNING)
ctx = AttemptContext(task=task, attempt=1, prompt="p", workdir=tmp, attempt_dir=tmp / "a", home=tmp / "h")
get_coder(sys.argv[1]).prepare(ctx)
print("prepared")
"""


def test_a_user_config_at_dev_zero_is_not_read(tmp_path: Path) -> None:
    """~/.gemini/settings.json or $CODEX_HOME/config.toml pointing at /dev/zero (or a huge file):
    the coder prepares its run without the user's layer, in bounded memory."""
    import resource

    gem = tmp_path / "g" / ".gemini"
    gem.mkdir(parents=True)
    (gem / "settings.json").symlink_to("/dev/zero")
    codex = tmp_path / "codex"
    codex.mkdir()
    (codex / "config.toml").write_bytes(b"# " + b"x" * (64 << 20) + b"\n")  # 64 MB of comment
    env = {**os.environ, "GEMINI_CLI_HOME": str(tmp_path / "g"), "CODEX_HOME": str(codex)}

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    for coder in ("gemini", "codex"):
        p = subprocess.run(
            [sys.executable, "-c", PREPARE, coder, str(tmp_path / coder)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            preexec_fn=limit,
        )
        assert p.returncode == 0 and "prepared" in p.stdout, (coder, p.stderr[-500:])


def test_a_short_lines_value_is_kept_without_measuring_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A line under a quarter of the cap holds a value under it whatever its shape (the worst is
    a list of one-digit numbers: 2 characters measured as 8), so its event keeps it as ``raw``
    without the walk that measures it (60 % of the normalizers' time); a longer line is walked."""
    walks: list[int] = []
    measure = base._size_over

    def counted(value: object, budget: int) -> int:
        walks.append(1)
        return measure(value, budget)

    monkeypatch.setattr(base, "_size_over", counted)
    n = (base.EVENT_FIELD_CAP // 4 - 3) // 2  # "[1,...,1]": 2n + 1 characters
    worst = "[" + ",".join(["1"] * n) + "]"
    assert len(worst) * 4 < base.EVENT_FIELD_CAP
    (e,) = ShellNormalizer("t", 1).feed(worst, 1.0)
    assert e.raw == [1] * n and walks == []
    assert measure(e.raw, base.EVENT_FIELD_CAP) >= 0  # the bound it relies on holds
    longer = "[" + ",".join(["1"] * (n + 2)) + "]"
    (e,) = ShellNormalizer("t", 1).feed(longer, 2.0)
    assert len(longer) * 4 >= base.EVENT_FIELD_CAP
    assert walks == [1] and e.raw is None  # measured: just over the cap (8 per number), left out


def test_an_event_made_in_one_step_is_the_same_frozen_event() -> None:
    """``Event.new`` (the normalizers' constructor) makes what ``Event(...)`` makes: equal, of
    equal hash, frozen, every default in place, an unknown field refused."""
    usage = Usage(input_tokens=3)
    made = Event.new("t", 1, 2, 3.0, "usage", usage=usage, session_id="s")
    assert made == Event(task_id="t", attempt=1, seq=2, ts=3.0, kind="usage", usage=usage, session_id="s")
    assert hash(made) == hash(replace(made))
    assert made.text is None and made.is_error is False and made.raw is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.text = "changed"  # type: ignore[misc]
    with pytest.raises(TypeError, match="no field 'txet'"):
        Event.new("t", 1, 2, 3.0, "text", txet="typo")


def test_a_lines_raw_value_is_stored_as_the_agent_printed_it() -> None:
    """An event whose ``raw`` is its whole line's value is stored with that line as ``raw``'s
    JSON (not encoded again) and reads back as the same event; ``logs --json`` never shows how."""
    line = (
        '{"type":"system","subtype":"init","session_id":"s1","model":"m",'
        '"cwd":"h\u00e9 \\u00e9 \\ud83d\\ude00","tools":["Bash",1,2.5e3,true,null]}'
    )
    events = ClaudeNormalizer("t", 1).feed(line, 1.0)
    kept = [e for e in events if e.raw is not None]
    assert kept and all(e.raw_json == line for e in kept)
    for e in events:
        payload = event_payload(e)
        back = event_from_row(e.task_id, e.attempt, e.seq, e.ts, e.kind, e.text, payload)
        assert back == e and back.raw == e.raw and json.loads(payload).get("raw") == e.raw
        assert "raw_json" not in event_json(e) and "raw_json" not in payload
    # an event made elsewhere (no line text) is encoded as before
    plain = replace(kept[0], raw_json=None)
    assert json.loads(event_payload(plain)) == json.loads(event_payload(kept[0]))


def test_the_payload_encoder_writes_what_json_dumps_writes() -> None:
    """The payload's encoder built once (``protocol._encode_payload``) is the C encoder that
    ``json.dumps(..., default=str)`` builds per call: the same text for every kind of value."""
    from fleet_tui.scheduler.store import protocol

    class Opaque:
        def __str__(self) -> str:
            return "opaque"

    samples: list[object] = [
        {},
        {"usage": {"input_tokens": 3, "output_tokens": 8}, "context_tokens": 3},
        {"raw": ["é", "\u2028", "\ud800", 1.5, -0.0, float("inf"), None, True, 2**80, {"k": [[]]}]},
        {"tool_input": {"path": "a\nb", "n": 1e300}, "x": Opaque()},
    ]
    for sample in samples:
        assert protocol._encode_payload(sample) == json.dumps(sample, default=str)
