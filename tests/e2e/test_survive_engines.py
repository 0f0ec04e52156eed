"""Other engines, other stores, the home's own safety (issue 12, points 10 and 11).

Real `fleet-tui` processes: an in-place task in a repository that holds the fleet home, a
database file deleted under a running engine, and a second engine on the same home with another
store sweeping worktrees at start-up.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers import FLEET, by_name, fleet, fleet_bg, fleet_env, pid_alive, shim_record, wait_for

pytestmark = pytest.mark.timeout(120)


def _repo(path: Path) -> Path:
    path.mkdir(parents=True)
    for args in (
        ["init", "-q", "-b", "main"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "init"],
    ):
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)
    return path


def test_home_inside_the_repository_of_an_in_place_task(tmp_path: Path) -> None:
    """Point 10: an in-place task whose repository holds the home is refused (its git clean would
    delete the queue); a worktree task in the same repository still runs."""
    repo = _repo(tmp_path / "repo")
    home = repo / ".fleet"
    fleet(home, "add", "clean", "--name", "clean", "--cwd", str(repo), "--command", "git clean -fdx")
    fleet(home, "add", "wt", "--name", "wt", "--cwd", str(repo), "--git-ref", "main", "--command", "true")
    p = fleet(home, "run", "--until-idle", timeout=60, check=False)
    assert p.returncode == 3 and (home / "fleet.db").exists(), p.stderr  # "clean" parks
    st = by_name(home)
    assert st["clean"]["status"] == "needs_human", st["clean"]
    assert "inside the git repository" in st["clean"]["reason"]
    assert st["wt"]["status"] == "done", st["wt"]


def test_engine_stops_when_its_database_file_is_deleted(tmp_path: Path) -> None:
    """Point 10: a database deleted under a running engine stops it with one clear line."""
    home = tmp_path / "home"
    fleet(home, "add", "s", "--name", "s", "--cwd", str(tmp_path), "--command", "sleep 300")
    run = subprocess.Popen(
        [*FLEET, "--home", str(home), "run"],
        env=fleet_env(home),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: by_name(home)["s"]["status"] == "running", 30, what="the task to run")
        for f in home.glob("fleet.db*"):
            f.unlink()
        _out, err = run.communicate(timeout=30)
        assert run.returncode == 1, err
        assert "was deleted while this engine ran" in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()


def test_engine_with_another_store_keeps_a_live_worktree(tmp_path: Path) -> None:
    """Point 11: an engine on the same home but another store does not sweep away the worktree of
    a task that runs under the first store."""
    repo = _repo(tmp_path / "repo")
    home = tmp_path / "home"
    fleet(home, "add", "w", "--name", "w", "--cwd", str(repo), "--git-ref", "main", "--command", "sleep 300")
    run = fleet_bg(home, "run", log=tmp_path / "run.log")
    try:
        wait_for(lambda: by_name(home)["w"]["status"] == "running", 30, what="the task to run")
        t = by_name(home)["w"]
        shim = shim_record(home / "tasks" / t["id"] / "attempts" / "1")
        wt = home / "worktrees" / "w"
        assert wt.is_dir()
        other = f"sqlite:///{tmp_path / 'other.db'}"
        p = fleet(home, "run", "--until-idle", "--store", other, timeout=60)
        assert wt.is_dir(), p.stdout + p.stderr
        assert pid_alive(shim["agent_pid"])
        assert by_name(home)["w"]["status"] == "running"
    finally:
        run.terminate()
        run.wait(timeout=30)


def test_engine_with_another_store_keeps_a_worktree_being_set_up(tmp_path: Path) -> None:
    """The worktree is marked before it is made: while its setup command runs (no agent, no
    lease yet), an engine with another store starting on the same home leaves it alone."""
    repo = _repo(tmp_path / "repo")
    home = tmp_path / "home"
    started = tmp_path / "setup-started"
    fleet(home, "config", "set", "worktree_setup", f"touch {started}; sleep 4")
    fleet(home, "add", "w", "--name", "w", "--cwd", str(repo), "--git-ref", "main", "--command", "true")
    run = fleet_bg(home, "run", "--until-idle", log=tmp_path / "run.log")
    try:
        wait_for(started.exists, 30, what="the worktree's setup to start")
        wt = home / "worktrees" / "w"
        assert wt.is_dir()
        other = f"sqlite:///{tmp_path / 'other.db'}"
        p = fleet(home, "run", "--until-idle", "--store", other, timeout=60)
        assert wt.is_dir(), p.stdout + p.stderr
        assert run.wait(timeout=60) == 0, (tmp_path / "run.log").read_text()
        assert by_name(home)["w"]["status"] == "done"
    finally:
        if run.poll() is None:
            run.terminate()
            run.wait(timeout=30)
