"""Store outages (issue 12, point 7): the engine waits them out, through real `fleet-tui` processes.

A SQLite writer that holds the lock longer than the engine's busy timeout, a full disk (a small
tmpfs mounted by the test; skipped where mounting is not allowed), and a restart of a PRIVATE
PostgreSQL instance the test starts with the installed binaries (never the shared one). In each
the engine stays up, says what it waits for, and finishes the task once, with its first attempt.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import FLEET, by_name, fleet, fleet_bg, fleet_env, quiet_home, wait_for

pytestmark = pytest.mark.timeout(180)


def _text(p: Path) -> str:
    return p.read_text(errors="replace") if p.exists() else ""


def _waiting_or_dead(run: subprocess.Popen[bytes], log: Path) -> bool:
    return "store unavailable" in _text(log) or run.poll() is not None


def _add_sleeper(home: Path, tmp: Path, side: Path, seconds: int, *extra: str) -> None:
    cmd = f"echo start >> {side}; sleep {seconds}; echo end >> {side}"
    fleet(home, *extra, "add", "s", "--name", "s", "--cwd", str(tmp), "--command", cmd)


def test_sqlite_lock_held_past_the_busy_timeout(tmp_path: Path) -> None:
    home, side, log = tmp_path / "home", tmp_path / "side.txt", tmp_path / "run.log"
    fleet(home, "config", "set", "heartbeat_s", "1")
    _add_sleeper(home, tmp_path, side, 3)
    run = fleet_bg(home, "run", log=log)
    try:
        wait_for(lambda: "start" in _text(side), 30, what="the agent to start")
        db = sqlite3.connect(home / "fleet.db", isolation_level=None, timeout=30)
        db.execute("BEGIN IMMEDIATE")  # another writer holds the lock, longer than any busy timeout
        try:
            wait_for(lambda: _waiting_or_dead(run, log), 60, what="the engine to wait for the store")
            assert run.poll() is None, _text(log)
            wait_for(lambda: "end" in _text(side), 30, what="the agent to finish during the lock")
        finally:
            db.execute("ROLLBACK")
            db.close()
        wait_for(lambda: by_name(home)["s"]["status"] == "done", 60, what="the task to finish")
        assert run.poll() is None, _text(log)
        st = by_name(home)["s"]
        assert st["attempt"] == 1 and _text(side).split() == ["start", "end"]
        wait_for(lambda: "store available again" in _text(log), 10, what="the engine to say so")
    finally:
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=30) == 0, _text(log)
    assert "Traceback" not in _text(log)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "small"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], capture_output=True)
    if p.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({p.stderr.decode().strip()}): the full-disk case is untested"
        )
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path: Path) -> None:
    """Write zeros to ``path`` until the filesystem has not one byte left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            while True:
                try:
                    if os.write(fd, b"\0" * size) < size:
                        break
                except OSError:
                    break
    finally:
        os.close(fd)


def test_full_disk_under_the_home(tmp_path: Path, small_disk: Path) -> None:
    home, side, log = small_disk / "home", tmp_path / "side.txt", tmp_path / "run.log"
    fleet(home, "config", "set", "heartbeat_s", "1")
    fleet(home, "config", "set", "disk_floor_gib", "0.01")  # the small disk is all there is
    flag = tmp_path / "go"
    cmd = f"echo start >> {side}; while [ ! -e {flag} ]; do sleep 0.1; done; echo end >> {side}"
    fleet(home, "add", "s", "--name", "s", "--cwd", str(tmp_path), "--command", cmd)
    run = fleet_bg(home, "run", log=log)
    filler = small_disk / "filler"
    try:
        wait_for(lambda: "start" in _text(side), 30, what="the agent to start")
        _fill(filler)
        flag.touch()  # the agent ends while the disk is full: its exit status must not be lost
        wait_for(lambda: "end" in _text(side), 30, what="the agent to end")
        wait_for(lambda: _waiting_or_dead(run, log), 60, what="the engine to wait for the store")
        assert run.poll() is None, _text(log)
        filler.unlink()
        wait_for(lambda: by_name(home)["s"]["status"] == "done", 60, what="the task to finish")
        st = by_name(home)["s"]
        assert st["attempt"] == 1 and _text(side).split() == ["start", "end"], (st, _text(log))
        assert run.poll() is None, _text(log)
    finally:
        filler.unlink(missing_ok=True)
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=30)
    assert "Traceback" not in _text(log)


# --------------------------------------------------------------------------- PostgreSQL


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivatePg:
    """A PostgreSQL cluster of the test's own (initdb + pg_ctl), run as a non-root user."""

    def __init__(self, bindir: Path, user: str) -> None:
        self.bindir = bindir
        self.user = user
        self.dir = Path(tempfile.mkdtemp(prefix="fleet-pg-"))
        os.chmod(self.dir, 0o755)
        pw = pwd.getpwnam(user)
        os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self.data = self.dir / "data"
        self.port = _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_user(self, *argv: str) -> subprocess.CompletedProcess[str]:
        cmd = list(argv)
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=self.dir)

    def ctl(self, *args: str, check: bool = True) -> bool:
        p = self._as_user(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.dir / "log"),
            "-o",
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1",
            "-w",
            *args,
        )
        assert p.returncode == 0 or not check, p.stdout + p.stderr
        return p.returncode == 0

    def init(self) -> None:
        p = self._as_user(
            str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"
        )
        assert p.returncode == 0, p.stdout + p.stderr
        self.ctl("start")

    def close(self) -> None:
        self._as_user(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def private_pg() -> Iterator[PrivatePg]:
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("no PostgreSQL binaries under /usr/lib/postgresql")
    user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    pg = PrivatePg(bindir, user)
    try:
        pg.init()
        yield pg
    finally:
        pg.close()


def test_postgres_restart_and_postmaster_kill(tmp_path: Path, private_pg: PrivatePg) -> None:
    home, side, log = tmp_path / "home", tmp_path / "side.txt", tmp_path / "run.log"
    quiet_home(home)
    env = fleet_env(home, FLEET_STORE=private_pg.url)
    fleet(home, "config", "set", "heartbeat_s", "1", env=env)
    flag = tmp_path / "go"
    cmd = f"echo start >> {side}; while [ ! -e {flag} ]; do sleep 0.1; done; echo end >> {side}"
    fleet(home, "add", "s", "--name", "s", "--cwd", str(tmp_path), "--command", cmd, env=env)
    run = subprocess.Popen(
        [*FLEET, "--home", str(home), "run"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=open(log, "ab"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: "start" in _text(side), 30, what="the agent to start")
        private_pg.ctl("restart", "-m", "fast")  # a restart of about a second
        # the postmaster killed outright: down until started again
        pid = int((private_pg.data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: _waiting_or_dead(run, log), 60, what="the engine to wait for the store")
        assert run.poll() is None, _text(log)
        flag.touch()  # the agent ends while the store is down
        wait_for(lambda: "end" in _text(side), 30, what="the agent to end")
        # its backends notice the postmaster's death and leave; then it can start again
        wait_for(lambda: private_pg.ctl("start", check=False), 60, interval=0.5, what="PostgreSQL back")
        wait_for(lambda: by_name_pg(home, env)["s"]["status"] == "done", 60, what="the task to finish")
        st = by_name_pg(home, env)["s"]
        assert st["attempt"] == 1 and _text(side).split() == ["start", "end"], (st, _text(log))
        assert run.poll() is None, _text(log)
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=30)
    assert "Traceback" not in _text(log)


def by_name_pg(home: Path, env: dict[str, str]) -> dict[str, dict[str, object]]:
    import json

    out = fleet(home, "status", "--json", env=env).stdout
    return {t["name"]: t for t in json.loads(out)}


def _pg_rows(url: str, text: str) -> list[tuple[object, ...]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        return list(c.execute(text).fetchall())


def test_hosts_with_clocks_a_minute_apart_keep_their_own_tasks(tmp_path: Path, private_pg: PrivatePg) -> None:
    """Point 12: leases and heartbeats are judged by the store's clock; a host whose clock runs 60 s
    ahead does not take the live task of another host."""
    home_a, home_b, side = tmp_path / "a", tmp_path / "b", tmp_path / "side.txt"
    env_a = fleet_env(home_a, FLEET_STORE=private_pg.url)
    env_b = fleet_env(home_b, FLEET_STORE=private_pg.url)
    for home, env in ((home_a, env_a), (home_b, env_b)):
        quiet_home(home)
        fleet(home, "config", "set", "heartbeat_s", "1", env=env)
        fleet(home, "config", "set", "lease_s", "4", env=env)
    flag = tmp_path / "go"
    cmd = f'echo "start $FLEET_ATTEMPT" >> {side}; while [ ! -e {flag} ]; do sleep 0.1; done'
    fleet(home_a, "add", "s", "--name", "s", "--cwd", str(tmp_path), "--command", cmd, env=env_a)
    run_a = subprocess.Popen(
        [*FLEET, "--home", str(home_a), "run", "--host-name", "a"],
        env=env_a,
        stdin=subprocess.DEVNULL,
        stdout=open(tmp_path / "a.log", "ab"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    ahead = (
        "import sys, time; _t = time.time; time.time = lambda: _t() + 60; "
        "from fleet_tui.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    run_b = None
    try:
        wait_for(lambda: "start 1" in _text(side), 30, what="the agent on host a")
        run_b = subprocess.Popen(
            [sys.executable, "-c", ahead, "--home", str(home_b), "run", "--host-name", "b"],
            env=env_b,
            stdin=subprocess.DEVNULL,
            stdout=open(tmp_path / "b.log", "ab"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )
        beat = "SELECT heartbeat FROM engines WHERE host = 'b' AND stopped = 0"
        first = wait_for(lambda: _pg_rows(private_pg.url, beat), 30, what="host b to start")[0][0]
        # host b has looked for orphans several times (every heartbeat), far past a's lease
        wait_for(
            lambda: any(float(str(r[0])) >= float(str(first)) + 6 for r in _pg_rows(private_pg.url, beat)),
            30,
            what="host b to run for six heartbeats",
        )
        assert run_b.poll() is None, _text(tmp_path / "b.log")
        flag.touch()
        wait_for(lambda: by_name_pg(home_a, env_a)["s"]["status"] == "done", 30, what="the task to finish")
        st = by_name_pg(home_a, env_a)["s"]
        assert st["attempt"] == 1 and st["host"] == "a", st
        assert _text(side).split("\n")[:1] == ["start 1"] and "start 2" not in _text(side)
    finally:
        for p in (run_a, run_b):
            if p is not None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=30)


def test_a_dead_hosts_finished_task_runs_again_elsewhere_at_least_once(
    tmp_path: Path, private_pg: PrivatePg
) -> None:
    """Point 13: the documented guarantee. A host dies for good after its agent finished but before
    any engine recorded the result: another host reclaims the task once the lease expired and runs
    it again (at least once after a host's death; exactly once across restarts on one host is
    test_engine_flows' adoption test). The README states it."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "exactly once" in readme and "at least once" in readme
    home_a, home_b, side = tmp_path / "a", tmp_path / "b", tmp_path / "side.txt"
    env_a = fleet_env(home_a, FLEET_STORE=private_pg.url)
    env_b = fleet_env(home_b, FLEET_STORE=private_pg.url)
    for home, env in ((home_a, env_a), (home_b, env_b)):
        quiet_home(home)
        fleet(home, "config", "set", "heartbeat_s", "1", env=env)
        fleet(home, "config", "set", "lease_s", "4", env=env)
    flag = tmp_path / "go"
    cmd = f'echo "run $FLEET_ATTEMPT" >> {side}; while [ ! -e {flag} ]; do sleep 0.1; done'
    fleet(home_a, "add", "s", "--name", "s", "--cwd", str(tmp_path), "--command", cmd, env=env_a)
    run_a = subprocess.Popen(
        [*FLEET, "--home", str(home_a), "run", "--host-name", "a"], env=env_a, stdin=subprocess.DEVNULL
    )
    wait_for(lambda: "run 1" in _text(side), 30, what="the agent on host a")
    t = by_name_pg(home_a, env_a)["s"]
    adir = home_a / "tasks" / str(t["id"]) / "attempts" / "1"
    run_a.kill()  # host a dies for good: its engine is never started again
    run_a.wait(timeout=10)
    flag.touch()  # ... after its agent finished there
    wait_for(lambda: (adir / "exit.json").exists(), 30, what="the agent's exit record on host a")
    run_b = subprocess.Popen(
        [*FLEET, "--home", str(home_b), "run", "--host-name", "b"],
        env=env_b,
        stdin=subprocess.DEVNULL,
        stdout=open(tmp_path / "b.log", "ab"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: by_name_pg(home_b, env_b)["s"]["status"] == "done", 60, what="host b to finish it")
    finally:
        run_b.send_signal(signal.SIGTERM)
        run_b.wait(timeout=30)
    st = by_name_pg(home_b, env_b)["s"]
    assert (st["status"], st["host"], st["attempt"]) == ("done", "b", 2), st
    assert _text(side).split("\n")[:2] == ["run 1", "run 2"]
