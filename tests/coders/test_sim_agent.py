"""The simulated agent, run as a real subprocess for every directive.

Its output must look like Claude Code's stream-json (the ``claude-*.jsonl`` fixtures in the shared
folder beside the repository), because the sim coder reads it with the Claude normalizer. These
tests do not use that normalizer: they check the raw lines, the files, exit codes and processes.
Synchronisation is by reading lines or polling with a deadline, never by sleeping.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_tui.coders import sim_agent

pytestmark = pytest.mark.timeout(60)

STREAMS = Path(__file__).resolve().parents[1] / "fixtures" / "streams"
AGENT = [sys.executable, "-m", "fleet_tui.coders.sim_agent"]


def sim_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(extra)
    return env


def run_sim(prompt: str, cwd: Path, timeout: float = 30, **env: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        AGENT, input=prompt.encode(), cwd=cwd, capture_output=True, timeout=timeout, env=sim_env(**env)
    )


def parsed(out: bytes) -> list[dict[str, Any]]:
    """Every stdout line as JSON (fails on a line that is not)."""
    return [json.loads(line) for line in out.splitlines()]


def of_type(objs: list[dict[str, Any]], t: str, subtype: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objs if o.get("type") == t and (subtype is None or o.get("subtype") == subtype)]


def tool_uses(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b for o in of_type(objs, "assistant") for b in o["message"]["content"] if b["type"] == "tool_use"]


def tool_results(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b for o in of_type(objs, "user") for b in o["message"]["content"] if b["type"] == "tool_result"]


def final(objs: list[dict[str, Any]]) -> dict[str, Any]:
    assert objs[-1]["type"] == "result", objs[-1]
    assert len(of_type(objs, "result")) == 1
    return objs[-1]


class Lines:
    """Reads a running process's stdout lines on a thread, so a test can wait with a deadline."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.q: queue.Queue[bytes | None] = queue.Queue()
        self.seen: list[bytes] = []
        assert proc.stdout is not None
        out = proc.stdout
        threading.Thread(target=self._pump, args=(out,), daemon=True).start()

    def _pump(self, out: Any) -> None:
        for line in iter(out.readline, b""):
            self.q.put(line)
        self.q.put(None)

    def wait_for(self, needle: bytes, timeout: float = 20) -> bytes:
        deadline = time.monotonic() + timeout
        while True:
            line = self.q.get(timeout=max(deadline - time.monotonic(), 0.01))
            assert line is not None, f"stdout closed before {needle!r}"
            self.seen.append(line)
            if needle in line:
                return line


@pytest.fixture
def proc_factory(tmp_path: Path) -> Iterator[Any]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(prompt: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(
            AGENT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=tmp_path,
            env=sim_env(),
        )
        assert p.stdin is not None
        p.stdin.write(prompt.encode())
        p.stdin.close()
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


# -- the shape of the stream ------------------------------------------------------------------


def fixture_keys() -> dict[tuple[str, str | None], tuple[set[str], set[str]]]:
    """(type, subtype) -> (keys every fixture line has, keys some fixture line has)."""
    out: dict[tuple[str, str | None], tuple[set[str], set[str]]] = {}
    for f in sorted(STREAMS.glob("claude-*.jsonl")):
        for raw in f.read_text(encoding="utf-8").splitlines():
            obj = json.loads(raw)
            sub = obj.get("subtype") if obj["type"] == "system" else None
            for key, keys in [
                ((obj["type"], sub), set(obj)),
                ((obj["type"] + ".message", None), set(obj.get("message") or {})),
            ]:
                if key[0].endswith(".message") and "message" not in obj:
                    continue
                if key in out:
                    out[key] = (out[key][0] & keys, out[key][1] | keys)
                else:
                    out[key] = (set(keys), set(keys))
    return out


def test_every_line_has_the_keys_of_the_fixture_lines_of_its_type(tmp_path: Path) -> None:
    prompt = "\n".join(
        [
            "Do the work.",
            "@sim steps=3 pace=0",
            "@sim write=a.txt text=one",
            "@sim ask=Which? options=A,B",
            "@sim api-retry=2 rate-warning=0.9",
            "@sim say=thinking",
            "@sim rate-limit=60 retries=1",
        ]
    )
    res = run_sim(prompt, tmp_path)
    objs = parsed(res.stdout)
    known = fixture_keys()
    extra_ok = {"result": {"errors"}}  # documented optional result field (FORMATS.md 1.2)
    seen = set()
    for obj in objs:
        sub = obj.get("subtype") if obj["type"] == "system" else None
        checks = [((obj["type"], sub), set(obj))]
        if "message" in obj:
            checks.append(((obj["type"] + ".message", None), set(obj["message"])))
        for key, keys in checks:
            assert key in known, f"no fixture line of type {key}"
            required, allowed = known[key]
            assert required <= keys, (key, required - keys)
            assert keys <= allowed | extra_ok.get(key[0], set()), (key, keys - allowed)
            seen.add(key)
    assert {
        ("system", "init"),
        ("assistant", None),
        ("user", None),
        ("system", "api_retry"),
        ("rate_limit_event", None),
        ("result", None),
    } <= seen


def test_no_directive_means_three_steps_and_success(tmp_path: Path) -> None:
    res = run_sim("Please fix the bug.", tmp_path)
    assert res.returncode == 0, res.stderr
    objs = parsed(res.stdout)
    init = objs[0]
    assert (init["type"], init["subtype"]) == ("system", "init")
    assert init["cwd"] == str(tmp_path) and init["session_id"] and "Bash" in init["tools"]
    assert all(o["session_id"] == init["session_id"] for o in objs)
    assert len(tool_uses(objs)) == 3 and len(tool_results(objs)) == 3
    assert {u["id"] for u in tool_uses(objs)} == {r["tool_use_id"] for r in tool_results(objs)}
    r = final(objs)
    assert r["subtype"] == "success" and r["is_error"] is False
    assert "took 3 steps" in r["result"]
    assert isinstance(r["total_cost_usd"], float) and r["total_cost_usd"] > 0
    assert r["duration_ms"] >= 0 and r["num_turns"] == 4


def test_usage_is_per_message_id_and_sums_to_the_result(tmp_path: Path) -> None:
    objs = parsed(run_sim("@sim steps=4 pace=0\n@sim say=done", tmp_path).stdout)
    by_id: dict[str, dict[str, int]] = {}
    for o in of_type(objs, "assistant"):
        mid, usage = o["message"]["id"], o["message"]["usage"]
        assert by_id.setdefault(mid, usage) == usage  # one message over several lines, same usage
    assert len(by_id) < len(of_type(objs, "assistant"))  # the text+tool_use split happens
    total = final(objs)["usage"]
    for k in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
        assert total[k] == sum(u[k] for u in by_id.values())


def test_context_climbs_toward_the_target(tmp_path: Path) -> None:
    objs = parsed(run_sim("@sim context=190000 window=200000 steps=6 pace=0", tmp_path).stdout)
    seen: dict[str, int] = {}
    for o in of_type(objs, "assistant"):
        u = o["message"]["usage"]
        seen.setdefault(
            o["message"]["id"],
            u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"],
        )
    ctx = list(seen.values())
    assert ctx == sorted(ctx) and len(set(ctx)) == len(ctx)
    assert ctx[-1] == 190000 and ctx[0] < 20000
    usage = final(objs)["modelUsage"]["claude-sim"]
    assert usage["contextWindow"] == 200000


def test_cost_and_model(tmp_path: Path) -> None:
    objs = parsed(run_sim("@sim cost=1.25 model=sonnet-x steps=1 pace=0", tmp_path).stdout)
    assert objs[0]["model"] == "sonnet-x"
    r = final(objs)
    assert r["total_cost_usd"] == 1.25 and r["modelUsage"]["sonnet-x"]["costUSD"] == 1.25


# -- files ----------------------------------------------------------------------------------------


def test_write_append_edit_change_real_files(tmp_path: Path) -> None:
    prompt = "\n".join(
        [
            '@sim write=sub/notes.md text="# Notes\\nhello world\\n"',
            '@sim append=sub/notes.md text="more\\n"',
            "@sim edit=sub/notes.md old=world new=fleet",
            "@sim edit=sub/notes.md old=absent new=x",
            "@sim write=../escape.txt text=no",
            "@sim pace=0",
        ]
    )
    res = run_sim(prompt, tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "sub" / "notes.md").read_text() == "# Notes\nhello fleet\nmore\n"
    assert not (tmp_path.parent / "escape.txt").exists()
    objs = parsed(res.stdout)
    names = [u["name"] for u in tool_uses(objs)]
    assert names == ["Write", "Bash", "Edit", "Edit", "Write"]
    assert [r["is_error"] for r in tool_results(objs)] == [False, False, False, True, True]
    write = tool_uses(objs)[0]["input"]
    assert write == {"file_path": str(tmp_path / "sub/notes.md"), "content": "# Notes\nhello world\n"}
    text = final(objs)["result"]
    assert "wrote sub/notes.md" in text and "edited sub/notes.md (1 replacement)" in text


def test_edit_all_replaces_every_occurrence(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("a a a")
    assert run_sim("@sim edit=f.txt old=a new=b all", tmp_path).returncode == 0
    assert (tmp_path / "f.txt").read_text() == "b b b"


def test_false_completion_claims_success_and_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("x")
    res = run_sim("Implement the feature.\n@sim false-completion", tmp_path)
    assert res.returncode == 0
    objs = parsed(res.stdout)
    assert tool_uses(objs) == []
    r = final(objs)
    assert r["is_error"] is False and "all tests pass" in r["result"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_fail_until_attempt(tmp_path: Path) -> None:
    prompt = "@sim fail-until-attempt=2 steps=1 pace=0\n@sim write=flaky.txt text=ok"
    first = run_sim(prompt, tmp_path, FLEET_ATTEMPT="1")
    assert first.returncode == 1
    r = final(parsed(first.stdout))
    assert r["is_error"] is True and "attempt 1" in r["result"]
    assert not (tmp_path / "flaky.txt").exists()
    second = run_sim(prompt, tmp_path, FLEET_ATTEMPT="2")
    assert second.returncode == 0 and final(parsed(second.stdout))["is_error"] is False
    assert (tmp_path / "flaky.txt").read_text() == "ok"


# -- endings ------------------------------------------------------------------------------------


def test_fail_is_an_error_result_and_exit_1(tmp_path: Path) -> None:
    res = run_sim('@sim steps=1 pace=0\n@sim fail="tests are red"\n@sim write=never.txt', tmp_path)
    assert res.returncode == 1
    r = final(parsed(res.stdout))
    assert r["is_error"] is True and r["subtype"] == "error_during_execution"
    assert r["result"] == "tests are red" and r["errors"] == ["tests are red"]
    assert not (tmp_path / "never.txt").exists()


@pytest.mark.parametrize("code", [0, 3])
def test_exit_code(tmp_path: Path, code: int) -> None:
    res = run_sim(f"@sim exit={code}", tmp_path)
    assert res.returncode == code
    assert final(parsed(res.stdout))["is_error"] is (code != 0)


def test_crash_has_no_result_line(tmp_path: Path) -> None:
    res = run_sim("@sim steps=1 pace=0 crash=5", tmp_path)
    assert res.returncode == 5
    assert of_type(parsed(res.stdout), "result") == []


def test_rate_limit_ends_like_claude_code(tmp_path: Path) -> None:
    before = time.time()
    res = run_sim("@sim steps=1 pace=0\n@sim rate-limit=600 retries=3", tmp_path)
    assert res.returncode == 1
    objs = parsed(res.stdout)
    retries = of_type(objs, "system", "api_retry")
    assert [r["attempt"] for r in retries] == [1, 2, 3]
    assert {(r["error_status"], r["error"]) for r in retries} == {(429, "rate_limit")}
    (event,) = of_type(objs, "rate_limit_event")
    info = event["rate_limit_info"]
    assert info["status"] == "rejected" and isinstance(info["resetsAt"], int)
    assert before + 598 <= info["resetsAt"] <= time.time() + 601
    synthetic = objs[-2]
    assert synthetic["type"] == "assistant" and synthetic["error"] == "rate_limit"
    assert synthetic["message"]["model"] == "<synthetic>"
    r = final(objs)
    assert r["is_error"] is True and r["api_error_status"] == 429 and r["subtype"] == "success"
    assert "session limit" in r["result"]


def test_api_retry_then_ok(tmp_path: Path) -> None:
    res = run_sim("@sim api-retry=2 status=529 pace=0", tmp_path)
    assert res.returncode == 0
    objs = parsed(res.stdout)
    assert [(r["error_status"], r["error"]) for r in of_type(objs, "system", "api_retry")] == [
        (529, "overloaded"),
        (529, "overloaded"),
    ]
    assert final(objs)["is_error"] is False


def test_rate_warning(tmp_path: Path) -> None:
    objs = parsed(run_sim("@sim rate-warning=0.8 seconds=100", tmp_path).stdout)
    info = of_type(objs, "rate_limit_event")[0]["rate_limit_info"]
    assert info["status"] == "allowed_warning" and info["utilization"] == 0.8


# -- hostile output -------------------------------------------------------------------------------


def test_garbage_invalid_utf8_huge_line_and_no_final_newline(tmp_path: Path) -> None:
    size = 3 * 1024 * 1024
    res = run_sim(f"@sim garbage=9 invalid-utf8 huge={size} no-final-newline", tmp_path)
    assert res.returncode == 0
    out = res.stdout
    assert not out.endswith(b"\n")
    lines = out.split(b"\n")
    assert b"\xff" in out and b"\xc3\x28" in out
    with pytest.raises(UnicodeDecodeError):
        out.decode("utf-8")
    huge = [line for line in lines if len(line) == size]
    assert len(huge) == 1 and json.loads(huge[0])["type"] == "assistant"
    garbage = lines[1:10]
    for g in garbage:
        try:
            obj = json.loads(g)
        except ValueError:
            continue
        assert not (isinstance(obj, dict) and obj.get("type") in {"assistant", "user", "system", "result"})
    assert json.loads(lines[-1])["type"] == "result"


def test_huge_accepts_size_suffixes() -> None:
    assert sim_agent.parse_size("64K") == 65536
    assert sim_agent.parse_size("2M") == 2 * 1024 * 1024
    assert sim_agent.parse_size("1000") == 1000


def test_stderr_directive_and_unknown_keys(tmp_path: Path) -> None:
    res = run_sim('@sim stderr="boom on stderr" frobnicate=1', tmp_path)
    assert res.returncode == 0
    err = res.stderr.decode()
    assert "boom on stderr" in err and "frobnicate" in err


def test_burst_rate(tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = run_sim("@sim burst=400 seconds=0.5", tmp_path)
    elapsed = time.monotonic() - t0
    objs = parsed(res.stdout)
    burst = [o for o in of_type(objs, "assistant") if o["message"]["id"].startswith("msg_sim_burst_")]
    assert len(burst) == 200
    assert len({o["message"]["id"] for o in burst}) == 200
    assert elapsed >= 0.45  # the last event is due at 199/400 s: the pace is kept, not just the count


def test_sleep(tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = run_sim("@sim sleep=0.3", tmp_path)
    assert time.monotonic() - t0 >= 0.3
    assert tool_uses(parsed(res.stdout))[0]["input"]["command"] == "sleep 0.3"


# -- processes -----------------------------------------------------------------------------------


def test_sigterm_is_ignored_when_asked(proc_factory: Any, tmp_path: Path) -> None:
    proc = proc_factory("@sim ignore-sigterm\n@sim wait-file=go")
    lines = Lines(proc)
    lines.wait_for(b"while [ ! -e go ]")
    proc.send_signal(signal.SIGTERM)  # it is blocked in the wait: a default handler would end it now
    (tmp_path / "go").touch()
    lines.wait_for(b'"type":"result"')
    assert proc.wait(timeout=20) == 0


def test_sigkill_still_kills(proc_factory: Any) -> None:
    proc = proc_factory("@sim ignore-sigterm wait-file=never")
    Lines(proc).wait_for(b"never")
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=20) == -signal.SIGKILL


def test_sigterm_ends_it_by_default(proc_factory: Any) -> None:
    proc = proc_factory("@sim wait-file=never")
    Lines(proc).wait_for(b"never")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == -signal.SIGTERM


def test_escaped_grandchild_lives_in_its_own_session(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    res = run_sim(f"@sim escape={pidfile} seconds=60", tmp_path)
    assert res.returncode == 0
    pid = int(pidfile.read_text())
    try:
        os.kill(pid, 0)  # alive after the agent exited
        assert os.getsid(pid) == pid  # a session leader: it escaped with setsid
        assert os.getsid(pid) != os.getsid(0)
        assert str(pid) in final(parsed(res.stdout))["result"]
    finally:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # reaped by init/subreaper; poll until gone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)


# -- prompt sources, parsing, imports ----------------------------------------------------------------


def test_prompt_from_env_and_argv(tmp_path: Path) -> None:
    env_run = subprocess.run(
        AGENT,
        cwd=tmp_path,
        capture_output=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        env=sim_env(FLEET_PROMPT="@sim steps=2 pace=0"),
    )
    assert "took 2 steps" in final(parsed(env_run.stdout))["result"]
    argv_run = subprocess.run(
        [*AGENT, "@sim steps=1 pace=0"],
        cwd=tmp_path,
        capture_output=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        env=sim_env(),
    )
    assert "took 1 steps" in final(parsed(argv_run.stdout))["result"]


def test_parse() -> None:
    prompt = 'text\n@sim steps=2 pace=0.5\n  @sim write=a.txt text="x y\\nz" ignore-sigterm\n@simx=1'
    plan = sim_agent.parse(prompt)
    assert plan.pace == 0.5 and plan.ignore_sigterm is True
    assert [(a.name, a.value) for a in plan.actions] == [("steps", "2"), ("write", "a.txt")]
    assert plan.actions[1].params == {"text": "x y\nz"}
    assert plan.warnings == []
    assert sim_agent.parse("@sim pace=fast").warnings
    assert [a.name for a in sim_agent.parse("no directives").actions] == ["steps"]


def test_startup_imports_nothing_heavy() -> None:
    code = (
        "import sys, fleet_tui.coders.sim_agent; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'textual','rich','anyio','mcp'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "[]", out.stderr


# -- ask_human through MCP -----------------------------------------------------------------------

ASK_SERVER = """
from mcp.server.mcpserver import MCPServer

app = MCPServer("ask_human")


@app.tool()
def ask_human(question: str, options: list[str] | None = None) -> str:
    return f"answer to {question}: {(options or ['none'])[-1]}"


if __name__ == "__main__":
    app.run()
"""


def test_ask_without_mcp_is_a_tool_error_and_the_run_goes_on(tmp_path: Path) -> None:
    res = run_sim('@sim ask="Which license?" options=MIT,Apache\n@sim steps=1 pace=0', tmp_path)
    assert res.returncode == 0
    objs = parsed(res.stdout)
    ask = tool_uses(objs)[0]
    assert ask["name"] == "mcp__ask_human__ask_human"
    assert ask["input"] == {"question": "Which license?", "options": ["MIT", "Apache"]}
    assert tool_results(objs)[0]["is_error"] is True
    assert "mcp__ask_human__ask_human" not in objs[0]["tools"]
    assert final(objs)["is_error"] is False


def test_ask_calls_the_mcp_server_and_returns_its_answer(tmp_path: Path) -> None:
    pytest.importorskip("mcp.server.mcpserver")
    server = tmp_path / "ask_server.py"
    server.write_text(ASK_SERVER)
    res = run_sim(
        '@sim ask="Which license?" options=MIT,Apache',
        tmp_path,
        FLEET_MCP_COMMAND=json.dumps([sys.executable, str(server)]),
    )
    assert res.returncode == 0, res.stderr
    objs = parsed(res.stdout)
    assert "mcp__ask_human__ask_human" in objs[0]["tools"]
    assert objs[0]["mcp_servers"] == [{"name": "ask_human", "status": "connected", "source": "dynamic"}]
    (result,) = tool_results(objs)
    assert result["is_error"] is False
    assert result["content"] == [{"type": "text", "text": "answer to Which license?: Apache"}]
    assert "Apache" in final(objs)["result"]


def test_ask_with_a_broken_mcp_command_is_a_tool_error(tmp_path: Path) -> None:
    res = run_sim("@sim ask=Why?", tmp_path, FLEET_MCP_COMMAND=json.dumps([str(tmp_path / "no-such-server")]))
    assert res.returncode == 0
    (result,) = tool_results(parsed(res.stdout))
    assert result["is_error"] is True and "ask_human failed" in result["content"][0]["text"]
