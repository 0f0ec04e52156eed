"""Every figure and every word the user sees is true (issue 15, points 1-15), through the real CLI.

Each test drives ``fleet-tui`` in a subprocess on the simulated agent (or the shell coder), the
way a daily user would, and checks what it prints or records: run endings and exit codes, costs
and budgets over whole tasks, times, false completions, reviewer verdicts, dependency causes,
names, answers, did-you-mean hints, the default coder, a broken config, the headless run's
lines, state seen without an engine, and the small words of plan/config/gates.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import FLEET, by_name, fleet, fleet_bg, quiet_home, status, wait_for

pytestmark = pytest.mark.timeout(120)


def home_with(tmp_path: Path, *lines: str) -> Path:
    home = tmp_path / "home"
    quiet_home(home)
    with (home / "config.toml").open("a") as fh:
        fh.write("".join(line + "\n" for line in lines))
    return home


def add(home: Path, name: str, prompt: str, *extra: str, cwd: Path | None = None) -> str:
    work = cwd or home.parent / "work"
    work.mkdir(exist_ok=True)
    args = ["add", prompt, "--name", name, "--coder", "sim", "--cwd", str(work), *extra]
    return fleet(home, *args).stdout.strip()


def git_env() -> dict[str, str]:
    who = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t"}
    return {**os.environ, **who, "GIT_COMMITTER_EMAIL": "t@x"}


def run_idle(home: Path, *extra: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return fleet(home, "run", "--until-idle", *extra, check=False, timeout=timeout)


# 1 -------------------------------------------------------------------------------------------
def test_until_idle_sits_out_a_backoff_and_exit_codes_say_what_is_left(tmp_path: Path) -> None:
    home = home_with(tmp_path, "retry_backoff_s = [2]")
    add(
        home,
        "flaky",
        "@sim fail-until-attempt=2 steps=1\n@sim write=f.txt text=ok",
        "--verify",
        "test -f f.txt",
    )
    add(home, "wrap", "@sim steps=1", "--after", "flaky")
    p = run_idle(home)
    assert p.returncode == 0, p.stdout + p.stderr  # everything finished
    assert {t["name"]: t["status"] for t in status(home)} == {"flaky": "done", "wrap": "done"}
    assert "everything finished" in p.stdout
    # something that needs a person: a distinct code, and it is named
    add(home, "broken", "@sim fail=nope", "--max-retries", "0")
    p = run_idle(home)
    assert p.returncode == 3, p.stdout + p.stderr
    assert "broken: needs_human: retries_exhausted" in p.stdout
    # --max-wait: a longer time-based wait is left, with its own code
    fleet(home, "config", "set", "retry_backoff_s", "600")
    add(home, "slow", "@sim fail-until-attempt=2 steps=1", "--max-retries", "3")
    fleet(home, "archive", "flaky", "wrap")
    fleet(home, "cancel", "broken")
    p = run_idle(home, "--max-wait", "5")
    assert p.returncode == 4, p.stdout + p.stderr
    assert "slow: waits until" in p.stdout


# 2 -------------------------------------------------------------------------------------------
def test_a_finished_agent_over_the_context_line_is_verified_not_handed_off(tmp_path: Path) -> None:
    home = home_with(tmp_path)
    add(
        home,
        "ctx",
        "@sim context=180000 steps=2\n@sim write=done.txt text=ok",
        "--verify",
        "test -f done.txt",
    )
    assert run_idle(home).returncode == 0
    t = by_name(home)["ctx"]
    assert (t["status"], t["attempt"], t["handoffs"], t["last_outcome"]) == ("done", 1, 0, "success"), t


# 3 -------------------------------------------------------------------------------------------
def test_budget_and_cost_cover_the_whole_task_and_the_day(tmp_path: Path) -> None:
    home = home_with(tmp_path, "retry_backoff_s = [0]", "budget_usd_daily = 100")
    add(home, "pricey", "@sim fail-until-attempt=3 steps=1 cost=0.25", "--budget-usd", "0.6")
    add(home, "cheap", "@sim fail-until-attempt=2 steps=1 cost=0.1")
    assert run_idle(home).returncode == 3
    t = by_name(home)
    # 0.25 + 0.25 = 0.50 < 0.60 allowed a third attempt; it spent 0.75 > 0.60: parked, not done
    assert t["pricey"]["status"] == "needs_human" and t["pricey"]["reason"].startswith("over_budget"), t
    assert t["pricey"]["cost_usd"] == pytest.approx(0.75) and t["pricey"]["attempt"] == 3
    assert t["cheap"]["status"] == "done" and t["cheap"]["cost_usd"] == pytest.approx(0.2)
    assert t["cheap"]["tokens"] > 0
    # the daily total is the sum of what the tasks show
    plan = fleet(home, "config", "set", "budget_usd_daily", "0.9")
    assert plan.returncode == 0
    add(home, "after", "@sim steps=1")
    line = next(ln for ln in fleet(home, "plan").stdout.splitlines() if ln.startswith("after:"))
    assert "daily budget spent: $0.95 of $0.90" in line, line


# 4 -------------------------------------------------------------------------------------------
def test_one_definition_of_elapsed_and_merge_keeps_finished_at(tmp_path: Path) -> None:
    home = home_with(tmp_path, "retry_backoff_s = [600]")
    add(home, "waits", "@sim fail=once steps=1 pace=0.3", "--max-retries", "2")
    assert run_idle(home, "--max-wait", "0").returncode == 4
    first = by_name(home)["waits"]
    assert first["status"] == "queued" and first["elapsed_s"] is not None and first["elapsed_s"] < 5, first
    time.sleep(1.5)  # time passes in the queue: it must not count
    again = by_name(home)["waits"]
    assert again["elapsed_s"] == pytest.approx(first["elapsed_s"]), (first, again)


def test_merge_does_not_rewrite_finished_at(tmp_path: Path) -> None:
    home = home_with(tmp_path)
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@x",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@x",
    }
    import os

    genv = {**os.environ, **env}
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "init"]):
        subprocess.run(["git", *args], cwd=repo, check=True, env=genv)
    add(home, "m", "@sim write=a.txt text=hi", "--git-ref", "main", cwd=repo)
    assert run_idle(home).returncode == 0
    before = by_name(home)["m"]
    time.sleep(1.1)
    fleet(home, "merge", "m", env={**genv, "FLEET_HOME": str(home)})
    after = by_name(home)["m"]
    assert after["merged_commit"] and after["finished_at"] == before["finished_at"], (before, after)
    assert after["elapsed_s"] == before["elapsed_s"]


# 5 -------------------------------------------------------------------------------------------
def test_false_completion_needs_proof_and_parks_with_what_happened(tmp_path: Path) -> None:
    home = home_with(tmp_path, "retry_backoff_s = [0]")
    (tmp_path / "liar").mkdir()
    (tmp_path / "draft").mkdir()
    add(home, "liar", "@sim false-completion", "--verify", "test -f x.txt", cwd=tmp_path / "liar")
    add(home, "draft", "@sim write=y.txt text=hi", "--verify", "test -f x.txt", cwd=tmp_path / "draft")
    assert run_idle(home).returncode == 3
    t = by_name(home)
    assert (t["liar"]["reason"], t["liar"]["false_completions"]) == ("false_completion", 3), t["liar"]
    # an honest draft a verifier rejects: max_retries=2, the third failure parks as verify_failed
    assert (t["draft"]["reason"], t["draft"]["false_completions"]) == ("verify_failed: run: test -f x.txt", 0)


# 6 -------------------------------------------------------------------------------------------
def test_a_reviewer_verdict_is_the_reason_and_its_stray_file_is_undone(tmp_path: Path) -> None:
    home = home_with(tmp_path, "retry_backoff_s = [0]")
    repo = tmp_path / "repo"
    repo.mkdir()
    genv = git_env()
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "init"]):
        subprocess.run(["git", *args], cwd=repo, check=True, env=genv)
    tasks = tmp_path / "tasks.toml"
    tasks.write_text(
        f"""
[[task]]
name = "authz"
coder = "sim"
cwd = "{repo}"
git_ref = "main"
max_retries = 0
prompt = "@sim write=api.py text=x"
  [[task.verify]]
  agent = "Review the diff for missing auth checks.\\n@sim say=\\"no auth check on get()\\"\\n@sim say=FAIL"
[[task]]
name = "sneaky"
coder = "sim"
cwd = "{repo}"
git_ref = "main"
max_retries = 0
prompt = "@sim write=ok.py text=x"
  [[task.verify]]
  agent = "Review.\\n@sim write=stray.txt text=oops\\n@sim say=PASS"
"""
    )
    fleet(home, "load", str(tasks), env={**genv, "FLEET_HOME": str(home)})
    p = fleet(home, "run", "--until-idle", check=False, env={**genv, "FLEET_HOME": str(home)})
    assert p.returncode == 3, p.stdout + p.stderr
    t = by_name(home)
    assert t["authz"]["reason"] == "verify_failed: agent: no auth check on get()", t["authz"]
    assert "Review the diff" not in t["authz"]["reason"]
    assert t["sneaky"]["status"] == "needs_human" and "read-only" in (t["sneaky"]["verify_output"] or "")
    wt = Path(t["sneaky"]["worktree"]) if t["sneaky"]["worktree"] else None
    log = subprocess.run(
        ["git", "log", "--all", "--name-only", "--format=%s"], cwd=repo, capture_output=True, text=True
    ).stdout
    assert "stray.txt" not in log, log  # never taken by a WIP commit
    assert wt is None or not (wt / "stray.txt").exists()


# 7 -------------------------------------------------------------------------------------------
def test_dependency_failed_names_the_root_cause_and_retry_of_the_child_says_why(tmp_path: Path) -> None:
    home = home_with(tmp_path)
    add(home, "root", "@sim fail=schema", "--max-retries", "0")
    add(home, "parent", "@sim steps=1", "--after", "root")
    add(home, "child", "@sim steps=1", "--after", "parent")
    assert run_idle(home).returncode == 3
    t = by_name(home)
    assert t["parent"]["reason"] == "dependency_failed: root (retries_exhausted)"
    assert t["child"]["reason"] == "dependency_failed: parent ← root (retries_exhausted)"
    p = fleet(home, "retry", "child", check=False)
    assert p.returncode == 1 and "depends on parent, which is needs_human" in p.stderr, p.stderr


# 8 -------------------------------------------------------------------------------------------
def test_names_are_reusable_once_finished_and_archive_hides_without_losing(tmp_path: Path) -> None:
    home = home_with(tmp_path)
    old = add(home, "docs", "@sim steps=1")
    p = fleet(home, "add", "x", "--name", "docs", "--coder", "sim", check=False)
    assert p.returncode == 1 and "'docs' is queued" in p.stderr and "already queued" not in p.stderr
    fleet(home, "cancel", "docs")
    new = add(home, "docs", "@sim steps=1")
    assert new != old
    assert run_idle(home).returncode == 0
    rows = [t for t in status(home) if t["name"] == "docs"]
    assert {r["id"]: r["status"] for r in rows} == {old: "cancelled", new: "done"}
    assert fleet(home, "logs", "docs").stdout  # by name: the newest
    fleet(home, "archive", old)
    assert [t["id"] for t in status(home)] == [new]
    every = json.loads(fleet(home, "status", "--json", "--all").stdout)
    assert {t["id"] for t in every} == {old, new}
    assert fleet(home, "logs", old).returncode == 0  # its records stay


# 9 -------------------------------------------------------------------------------------------
def test_answer_must_match_an_option_with_a_did_you_mean(tmp_path: Path) -> None:
    home = home_with(tmp_path)
    add(home, "asker", '@sim ask="Deploy where?" options=staging,prod\n@sim steps=1')
    run = fleet_bg(home, "run", "--until-idle", log=tmp_path / "run.log")
    try:
        q = wait_for(
            lambda: json.loads(fleet(home, "questions", "--json").stdout) or None, 60, what="question"
        )[0]
        assert q["options"] == ["staging", "prod"] and q["free_text"] is False
        bad = fleet(home, "answer", q["id"], "prood", check=False)
        assert bad.returncode == 1 and "did you mean 'prod'" in bad.stderr, bad.stderr
        assert fleet(home, "answer", q["id"], "PROD").returncode == 0
        assert run.wait(timeout=60) == 0, (tmp_path / "run.log").read_text()
    finally:
        if run.poll() is None:
            run.kill()
    events = fleet(home, "logs", "asker", "--json").stdout
    assert '"prod"' in events or "prod" in events


# 10 ------------------------------------------------------------------------------------------
def test_did_you_mean_for_names_refs_and_commands(tmp_path: Path) -> None:
    home = home_with(tmp_path)
    add(home, "k1", "@sim steps=1")
    p = fleet(home, "kill", "k11", check=False)
    assert p.returncode == 1 and "did you mean 'k1'" in p.stderr, p.stderr
    p = fleet(home, "stauts", check=False)
    assert p.returncode == 2 and "did you mean 'status'" in p.stderr, p.stderr
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@x", "commit", "-q", "--allow-empty", "-m", "i"],
        cwd=repo,
        check=True,
    )
    p = fleet(home, "add", "x", "--coder", "sim", "--cwd", str(repo), "--git-ref", "mian", check=False)
    assert p.returncode == 1 and "did you mean 'main'" in p.stderr, p.stderr


# 11 ------------------------------------------------------------------------------------------
def test_the_default_coder_is_checked(tmp_path: Path) -> None:
    home = home_with(tmp_path, 'default_coder = "gemini"')
    bare = tmp_path / "bare-path"  # a PATH without the gemini program
    bare.mkdir()
    env = {**os.environ, "PATH": str(bare), "FLEET_HOME": str(home)}
    p = fleet(home, "add", "hello", "--cwd", str(tmp_path), check=False, env=env)
    assert p.returncode == 1 and "gemini" in p.stderr and "default coder" in p.stderr, p.stderr
    tasks = tmp_path / "t.toml"
    tasks.write_text(f'[[task]]\nname = "a"\nprompt = "hi"\ncwd = "{tmp_path}"\n')
    p = fleet(home, "validate", str(tasks), check=False, env=env)
    assert p.returncode == 1 and f"{tasks}:1:" in p.stderr and "default coder" in p.stderr, p.stderr
    assert fleet(home, "load", str(tasks), check=False, env=env).returncode == 1
    assert status(home) == []


# 12 ------------------------------------------------------------------------------------------
def test_a_broken_config_keeps_reads_working_and_config_set_repairs_it(tmp_path: Path) -> None:
    home = home_with(tmp_path)
    add(home, "a", "@sim steps=1")
    cfg = home / "config.toml"
    cfg.write_text(cfg.read_text() + 'max_concurrent = "lots"\n')
    for args in (("status",), ("plan",), ("config", "get", "max_load_per_core"), ("hosts",)):
        p = fleet(home, *args, check=False)
        assert p.returncode == 0 and "config is broken" in p.stderr, (args, p.stderr)
    assert fleet(home, "config", "get", "max_load_per_core").stdout.strip() == "1000"
    p = fleet(home, "run", "--until-idle", check=False)
    assert p.returncode == 1 and "max_concurrent must be a whole number" in p.stderr, p.stderr
    assert fleet(home, "config", "set", "max_concurrent", "2").returncode == 0
    assert "broken" not in fleet(home, "status").stderr
    cfg.write_text(cfg.read_text() + "max_concurrent = [\n")  # not even TOML
    assert fleet(home, "config", "set", "max_concurrent", "3").returncode == 0
    assert fleet(home, "config", "get", "max_concurrent").stdout.strip() == "3"


def test_hosts_counts_every_engine_of_a_machine(tmp_path: Path) -> None:
    """Two engines on one machine write one host row in turn, each with its own agents: `hosts`
    counts a live host's agents from the tasks (it said 1 here, the last writer's, for 3)."""
    from fleet_tui.scheduler.model import Host, TaskSpec
    from fleet_tui.scheduler.store.sqlite_store import SqliteStore

    home = tmp_path / "home"
    fleet(home, "status")  # the home and its store
    store = SqliteStore(str(home / "fleet.db"))
    now = time.time()
    try:
        store.add_tasks([TaskSpec(name=f"t{i}", prompt="x", cwd=str(tmp_path)) for i in range(4)], now)
        for owner in ("engine-a", "engine-a", "engine-b"):
            assert store.claim(owner, "box", (), now, 600.0, "shell", None) is not None
        store.upsert_host(Host(name="box", heartbeat=now, cores=2, running=1))  # engine-b's report
    finally:
        store.close()
    out = fleet(home, "hosts").stdout
    assert "box live" in out and "running 3 " in out, out


def test_plan_counts_the_agents_a_live_engine_runs_on_this_machine(tmp_path: Path) -> None:
    """With an engine running here at its cap, `plan` says the queue waits for slots, as that
    engine does; it used to plan from empty slots and say "would start" for every task."""
    import socket

    from fleet_tui.scheduler.model import TaskSpec
    from fleet_tui.scheduler.store.sqlite_store import SqliteStore

    home = home_with(tmp_path, "max_concurrent = 3")
    fleet(home, "status")  # the home and its store
    store = SqliteStore(str(home / "fleet.db"))
    now = time.time()
    try:
        store.add_tasks(
            [TaskSpec(name=f"t{i}", prompt="x", cwd=str(tmp_path), coder="sim") for i in range(5)], now
        )
        store.register_engine("engine-a", socket.gethostname(), os.getpid(), 0.0, now)
        for _ in range(3):
            assert store.claim("engine-a", socket.gethostname(), (), now, 600.0, "sim", None) is not None
    finally:
        store.close()
    out = fleet(home, "plan").stdout
    assert out.count("waits: slots full: 3/3 running") == 2, out
    store = SqliteStore(str(home / "fleet.db"))
    try:
        store.unregister_engine("engine-a", time.time())  # gone: its agents are no engine's slots
    finally:
        store.close()
    out = fleet(home, "plan").stdout
    assert "t3: would start" in out and "t4: would start" in out, out


def test_plan_counts_against_the_cap_a_live_engine_runs_with(tmp_path: Path) -> None:
    """An engine started with `run --max-concurrent 1` while config.toml says 4: `plan` says the
    queue behind its one agent waits for a slot, as that engine does (it counted against the
    config's 4 and said "would start"), and `status --gauges` says 1/1 (it said 1/4). Once the
    engine stops, the config's cap counts again."""
    home = home_with(tmp_path, "max_concurrent = 4")
    for i in range(3):
        add(home, f"t{i}", "@sim sleep=60")
    log = tmp_path / "run.log"
    run = fleet_bg(home, "run", "--max-concurrent", "1", log=log)
    try:
        wait_for(lambda: by_name(home).get("t0", {}).get("status") == "running", 30, what="t0 to run")
        out = fleet(home, "plan").stdout
        assert "t1: waits: slots full: 1/1 running" in out and "would start" not in out, out
        assert slots(home)["value"] == "1/1"  # `status --gauges` counts against it too
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=30)
    out = fleet(home, "plan").stdout
    assert "t0: would start" in out and "t2: would start" in out, out
    assert slots(home)["value"] == "0/4"


def slots(home: Path) -> dict[str, Any]:
    """The slots gauge of `status --gauges --json`."""
    gauges = json.loads(fleet(home, "status", "--gauges", "--json").stdout)["gauges"]
    return next(g for g in gauges if g["key"] == "slots")


def test_a_running_engine_prints_a_rejected_config_edit(tmp_path: Path) -> None:
    home = home_with(tmp_path)
    log = tmp_path / "run.log"
    run = fleet_bg(home, "run", log=log)
    try:
        wait_for(lambda: "live" in fleet(home, "hosts").stdout or None, 30, what="engine up")
        cfg = home / "config.toml"
        cfg.write_text(cfg.read_text() + "max_concurrent = 0\n")
        wait_for(lambda: "config not reloaded" in log.read_text() or None, 30, what="the rejection")
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=30)
    assert "stopped; no agent was running" in log.read_text()


# 13 ------------------------------------------------------------------------------------------
def test_headless_run_prints_each_change_and_says_what_it_did(tmp_path: Path) -> None:
    home = home_with(tmp_path, "retry_backoff_s = [1]")
    add(home, "one", "@sim fail-until-attempt=2 steps=1")
    add(home, "two", "@sim steps=1", "--after", "one")
    p = run_idle(home)
    assert p.returncode == 0
    out = p.stdout
    for line in ("one: queued -> running (attempt 1)", "one: running -> queued: failed", "two: after one",
                 "one: queued -> running (attempt 2)", "two: running -> done"):  # fmt: skip
        assert line in out, out
    assert "requeued" not in out + p.stderr
    quiet = home.parent / "q"
    qh = home_with(quiet)
    add(qh, "three", "@sim steps=1", cwd=tmp_path)
    assert fleet(qh, "run", "--until-idle", "--quiet").stdout.splitlines() == [
        "idle; everything finished (1 task(s) done or cancelled)"
    ]
    add(qh, "four", "@sim steps=1", cwd=tmp_path)
    out = fleet(qh, "run", "--until-idle", "--json").stdout
    lines = [json.loads(ln) for ln in out.splitlines() if ln[:1] == "{"]
    assert ("four", "done") in {(d["task"], d["status"]) for d in lines if d["kind"] == "state"}, out
    # stopped by a signal with an agent working: it says it stopped it and requeued its task
    add(qh, "long", "@sim sleep=60", cwd=tmp_path)
    log = tmp_path / "long.log"
    run = fleet_bg(qh, "run", log=log)
    wait_for(lambda: by_name(qh)["long"]["status"] == "running" or None, 30, what="long running")
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=60) == 0
    assert "1 agent(s) stopped and their tasks requeued" in log.read_text()


def test_a_run_held_by_a_gate_says_why_and_max_wait_bounds_it(tmp_path: Path) -> None:
    """A queue held by a headroom gate (here the disk's floor, set far above the free space: what
    a full disk does) with nothing running: `run` prints why each task waits (it printed nothing
    until stopped), a later run says it again at its start, and `--until-idle --max-wait S` gives
    up after S seconds with exit 4 (it waited until a CI job's own timeout killed it)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(
        "max_load_per_core = 1000.0\nmem_floor_gib = 0.1\ndisk_floor_gib = 1e9\n"
    )
    add(home, "held", "@sim steps=1")
    p = run_idle(home, "--max-wait", "1")
    assert p.returncode == 4, p.stdout + p.stderr
    assert "held: waits: disk: " in p.stdout and "GiB floor" in p.stdout, p.stdout
    assert "stopped waiting (--max-wait): a gate above held every task for more than 1 s" in p.stdout
    assert by_name(home)["held"]["status"] == "queued"
    again = run_idle(home, "--max-wait", "1", "--json")
    assert again.returncode == 4
    first = json.loads(again.stdout.splitlines()[0])
    assert (first["kind"], first["task"]) == ("waiting", "held") and first["waiting"].startswith("disk: ")


def test_an_idle_run_beside_a_busy_engine_says_what_still_runs_there(tmp_path: Path) -> None:
    """A second `run --until-idle` on the same store, with nothing of its own to do while the first
    engine's agent works: it ended on "idle; everything finished", which was not true."""
    home = home_with(tmp_path)
    add(home, "done-one", "@sim steps=1")
    assert run_idle(home).returncode == 0
    add(home, "long", "@sim sleep=60")
    first = fleet_bg(home, "run", log=tmp_path / "first.log")
    try:
        wait_for(lambda: by_name(home)["long"]["status"] == "running" or None, 30, what="long running")
        p = run_idle(home, "--quiet")
        assert p.returncode == 0, p.stdout + p.stderr
        host = by_name(home)["long"]["host"]
        assert p.stdout.splitlines() == [
            "idle here; 1 task(s) still run on another engine:",
            f"  long: running on {host}",
        ], p.stdout
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)


def test_a_headless_run_piped_into_a_reader_that_leaves_still_runs_its_tasks(tmp_path: Path) -> None:
    """`fleet-tui run --until-idle | head -3`: the reader leaves after three lines. The next line
    used to raise BrokenPipeError through the engine's task group and end the run mid-way, four
    tasks left running under a dead engine; the run now stops printing and finishes its work."""
    home = home_with(tmp_path)
    for i in range(8):
        add(home, f"t{i}", "@sim steps=2 pace=0.05")
    run = subprocess.Popen(
        [*FLEET, "--home", str(home), "run", "--until-idle"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k not in ("FLEET_STORE", "FLEET_HOME")},
    )
    assert run.stdout is not None
    first = [run.stdout.readline() for _ in range(3)]
    assert all(b"->" in line for line in first), first
    run.stdout.close()  # `head` exits
    _, err = run.communicate(timeout=120)
    assert run.returncode == 0, err.decode(errors="replace")
    assert {t["status"] for t in status(home)} == {"done"}, status(home)


# 14 ------------------------------------------------------------------------------------------
def test_without_an_engine_status_says_so_and_computes_waiting(tmp_path: Path) -> None:
    home = home_with(tmp_path, "heartbeat_s = 0.2")
    tasks = tmp_path / "t.toml"
    tasks.write_text(
        f'[[task]]\nname = "needs-gpu"\ncoder = "sim"\nprompt = "x"\ncwd = "{tmp_path}"\nrequires = ["gpu"]\n'
    )
    fleet(home, "load", str(tasks))
    p = fleet(home, "status")
    assert "no engine is running on this store" in p.stderr
    rows: dict[str, Any] = {t["name"]: t for t in json.loads(fleet(home, "status", "--json").stdout)}
    assert rows["needs-gpu"]["waiting"] == "needs tags: gpu"  # never null for a task that cannot start
    assert fleet(home, "run", "--until-idle", check=False).returncode == 0  # left for a gpu host

    # the host that ran is silent now: its figures are its last report, and say so
    def silent() -> str | None:
        out = fleet(home, "hosts").stdout
        return out if "silent" in out else None

    hosts = wait_for(silent, 30, what="a silent host")
    assert "its figures are that old" in hosts and "none now" in hosts, hosts


def test_without_an_engine_a_task_behind_the_cap_is_not_said_to_wait_for_starts(tmp_path: Path) -> None:
    """No engine runs: nothing is running or starting, and the status says so of the tasks behind
    the cap too (it said "slots full: 0/1 running + 1 starting before it")."""
    home = home_with(tmp_path, "max_concurrent = 1")
    add(home, "first", "@sim steps=1")
    add(home, "second", "@sim steps=1")
    rows: dict[str, Any] = {t["name"]: t for t in json.loads(fleet(home, "status", "--json").stdout)}
    assert rows["first"]["waiting"] == "ready: starts when an engine runs"
    assert rows["second"]["waiting"] == "ready: starts when an engine runs and a slot is free (1 at a time)"


# 15 ------------------------------------------------------------------------------------------
def test_small_words(tmp_path: Path) -> None:
    home = home_with(tmp_path, "max_concurrent = 1", "retry_backoff_s = [1, 2]")
    add(home, "a", "@sim steps=1")
    add(home, "b", "@sim steps=1")
    plan = fleet(home, "plan").stdout
    assert "b: waits: slots full: 0/1 running + 1 starting before it" in plan, plan
    assert fleet(home, "config", "get", "retry_backoff_s").stdout.strip() == "[1, 2]"
    fleet(home, "config", "set", "max_load_per_core", "0.01")
    fleet(home, "config", "set", "max_concurrent", "2")  # the first agent starts whatever the load
    plan = fleet(home, "plan").stdout
    assert "> 0.01" in plan and "> 0.0:" not in plan and "> 0.0\n" not in plan, plan
    # a big task file's load names twenty of its tasks, not all of them on one line
    many = tmp_path / "many.toml"
    many.write_text("".join(f'[[task]]\nname = "m{i:02d}"\nprompt = "x"\ncoder = "sim"\n' for i in range(25)))
    out = fleet(home, "load", str(many)).stdout.strip()
    assert out == "queued 25: " + ", ".join(f"m{i:02d}" for i in range(20)) + " and 5 more", out


def test_a_rate_limit_event_names_the_tasks_account(tmp_path: Path) -> None:
    """Point 15: the stream pane and `logs` said "claude" for a sim account: the event carries the
    task's own account (coder:model for the sim coder)."""
    home = home_with(tmp_path)
    add(home, "warned", "@sim rate-warning=0.5 seconds=600\n@sim steps=1", "--model", "sim-b")
    assert run_idle(home).returncode == 0
    events = [json.loads(ln) for ln in fleet(home, "logs", "warned", "--json").stdout.splitlines()]
    (rl,) = [e["rate_limit"] for e in events if e["kind"] == "rate_limit"]
    assert rl["account"] == "sim:sim-b", rl
