"""Issue 12, the input/security/bounds points: hostile text, bad input, other users, big files.

Each test drives the real `fleet-tui` command in a subprocess; the store is filled through the
Store API where a real agent would take minutes to produce the same row (a reason holding an
agent's escape codes, 12 000 events). Permission tests create a second real user and drop to it;
read-only and full-disk homes are small tmpfs mounts. Both need root and are skipped otherwise.
"""

from __future__ import annotations

import json
import os
import pty
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_tui.scheduler.attempts.launch import attempt_dir
from fleet_tui.scheduler.model import Event, TaskSpec
from fleet_tui.scheduler.states import TaskStatus
from fleet_tui.scheduler.store.sqlite_store import SqliteStore
from helpers import FLEET, fleet, fleet_env

ROOT = os.geteuid() == 0
OTHER = "fleetother"
OSC52 = "\x1b]52;c;cm0gLXJmIC8=\x07"


def store_with_task(home: Path, name: str = "hostile", reason: str | None = None) -> tuple[SqliteStore, str]:
    """A home whose store holds one task that ran one attempt and stopped with ``reason``."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        "max_load_per_core = 1000.0\nmem_floor_gib = 0.1\ndisk_floor_gib = 0.1\n"
    )
    st = SqliteStore(str(home / "fleet.db"))
    (t,) = st.add_tasks([TaskSpec(name=name, prompt="p", cwd=str(home), coder="sim")], time.time())
    st.claim("owner-x", "h", (), time.time(), 30.0, "sim", None)
    st.transition(t.id, TaskStatus.CANCELLED, reason=reason or "cancelled", now=time.time())
    return st, t.id


def no_traceback(p: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert p.stderr.startswith(("fleet-tui: ", "/")), p.stderr


# -- 2: agent text never drives the terminal ---------------------------------------------------------
def test_status_and_graph_show_escapes_visibly(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store_with_task(home, reason=f"auth_failed: {OSC52}\x1b]0;title\x07\nsecond line")
    for args in (("status",), ("status", "--graph")):
        out = fleet(home, *args).stdout
        assert "\x1b" not in out and "\x07" not in out
        assert "␛]52;c;cm0gLXJmIC8=␇" in out
        assert len(out.strip().splitlines()) == 1  # a multi-line reason stays on its task's line


def _pty_output(cmd: list[str], env: dict[str, str]) -> bytes:
    master, slave = pty.openpty()
    p = subprocess.Popen(cmd, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    p.wait(timeout=60)
    os.close(master)
    return b"".join(chunks)


def test_logs_raw_is_inert_on_a_terminal_and_exact_in_a_pipe(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _, tid = store_with_task(home)
    raw = f'{{"type":"text","text":"{OSC52}"}}\n'.encode() + b"\x1b]0;owned\x07plain\n\xff\xfe\n"
    d = attempt_dir(home, tid, 1)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stdout.jsonl").write_bytes(raw)
    piped = subprocess.run([*FLEET, "--home", str(home), "logs", "hostile", "--raw"], capture_output=True)
    assert piped.returncode == 0 and piped.stdout == raw  # a pipe gets the bytes as they are
    shown = _pty_output([*FLEET, "--home", str(home), "logs", "hostile", "--raw"], fleet_env(home))
    assert b"\x1b" not in shown and b"\x07" not in shown
    assert "␛]52;c;cm0gLXJmIC8=␇".encode() in shown and "␛]0;owned␇plain".encode() in shown


# -- 8: read-only commands need no write lock ----------------------------------------------------------
READ_ONLY = (("status",), ("status", "--json"), ("logs", "ro-task"), ("questions",), ("hosts",), ("plan",))


def _read_only_commands_work(home: Path) -> None:
    for args in READ_ONLY:
        p = subprocess.run(
            [*FLEET, "--home", str(home), *args],
            capture_output=True,
            text=True,
            timeout=20,
            env=fleet_env(home),
            stdin=subprocess.DEVNULL,
        )
        assert p.returncode == 0, (args, p.stdout, p.stderr)
        if args == ("status",):
            assert "ro-task" in p.stdout


def test_read_only_commands_work_while_another_process_holds_the_write_lock(tmp_path: Path) -> None:
    home = tmp_path / "home"
    st, _ = store_with_task(home, name="ro-task")
    st.close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys; db = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "db.execute('BEGIN IMMEDIATE'); db.execute(\"UPDATE tasks SET priority = 1\"); "
            "print('locked', flush=True); sys.stdin.read()",
            str(home / "fleet.db"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        _read_only_commands_work(home)  # each within 20 s (the busy timeout is 30 s)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=10)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    if not ROOT:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mnt)]).returncode:
        pytest.skip("this machine does not allow mounting a tmpfs")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_read_only_commands_work_on_a_read_only_home(tmpfs: Path) -> None:
    st, _ = store_with_task(tmpfs / "home", name="ro-task")
    st.close()
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    _read_only_commands_work(tmpfs / "home")


def test_read_only_commands_work_on_a_full_disk(tmpfs: Path) -> None:
    st, _ = store_with_task(tmpfs / "home", name="ro-task")
    st.close()
    with open(tmpfs / "filler", "wb") as fh, pytest.raises(OSError):
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()
    _read_only_commands_work(tmpfs / "home")


# -- 9: a bad --store is refused, never replaced by the home's fleet.db --------------------------------
@pytest.mark.parametrize(
    "url",
    ["mysql://u@h/db", "garbage", "sqlite://rel.db", "sqlite:///{tmp}/no/such/folder/x.db", "{tmp}/x.db"],
)
def test_bad_store_url_is_refused(tmp_path: Path, url: str) -> None:
    url = url.format(tmp=tmp_path)
    home = tmp_path / "home"
    p = fleet(home, "--store", url, "add", "hello", "--coder", "sim", check=False)
    no_traceback(p)
    assert "store" in p.stderr and url.split("/")[0] in p.stderr
    assert not (home / "fleet.db").exists()  # nothing was queued in the home's store instead
    p = fleet(home, "--store", url, "status", check=False)
    no_traceback(p)
    if not url.startswith("sqlite:///"):  # a URL no store can have is refused by `config set` too
        p = fleet(home, "config", "set", "store", url, check=False)
        no_traceback(p)
        assert "store" in p.stderr


# -- 14/15: other users can neither read nor take over a home --------------------------------------------
@pytest.fixture
def other_user() -> str:
    if not ROOT:
        pytest.skip("creating a second user needs root")
    if subprocess.run(["id", OTHER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", OTHER], check=True)
    return OTHER


def as_other(user: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", user, "--", *cmd], capture_output=True, text=True, timeout=30)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder other users can reach (0755), as a real user's ~/.local/state is."""
    d = Path(tempfile.mkdtemp(prefix="fleet-open-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_home_and_every_file_are_private(open_dir: Path, other_user: str) -> None:
    home = open_dir / "home"  # created by fleet-tui itself
    env = fleet_env(home)
    work = open_dir / "work"
    work.mkdir()
    work.chmod(0o755)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*FLEET, "--home", str(home), *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=work,
            preexec_fn=lambda: os.umask(0o022),
        )

    assert run("config", "set", "max_load_per_core", "1000").returncode == 0
    assert run("config", "set", "mem_floor_gib", "0.1").returncode == 0
    p = run("add", "secret prompt", "--name", "s1", "--coder", "shell", "--command", "echo out > made.txt")
    assert p.returncode == 0, p.stderr
    p = run("run", "--until-idle")
    assert p.returncode == 0, p.stderr
    assert (home.stat().st_mode & 0o777) == 0o700
    files = [x for x in home.rglob("*") if x.is_file() and not x.is_symlink()]
    names = {x.name for x in files}
    assert {"fleet.db", "config.toml", "prompt.txt", "stdout.jsonl", "stderr.log"} <= names, names
    loose = [f"{x} {x.stat().st_mode & 0o777:o}" for x in files if x.stat().st_mode & 0o077]
    assert not loose, loose
    for path in (home / "fleet.db", next(home.rglob("prompt.txt"))):
        assert as_other(other_user, "cat", str(path)).returncode != 0
    assert as_other(other_user, "ls", str(home)).returncode != 0
    # the agent's own work keeps the user's umask
    assert ((work / "made.txt").stat().st_mode & 0o777) == 0o644


def test_home_or_config_another_user_can_write_is_refused(open_dir: Path, other_user: str) -> None:
    home = open_dir / "home"
    fleet(home, "status")
    cfg = home / "config.toml"
    cfg.write_text('worktree_setup = "touch /tmp/fleet-pwned"\n')
    # another user cannot plant a config in the (private) home
    assert as_other(other_user, "sh", "-c", f"echo x >> {cfg}").returncode != 0
    shutil.chown(cfg, user=other_user)
    p = fleet(home, "status", check=False)
    no_traceback(p)
    assert f"belongs to {other_user}" in p.stderr and "chown" in p.stderr
    shutil.chown(cfg, user="root")
    cfg.chmod(0o666)
    p = fleet(home, "run", "--until-idle", check=False)
    no_traceback(p)
    assert "chmod go-w" in p.stderr
    cfg.chmod(0o600)
    home.chmod(0o777)
    p = fleet(home, "status", check=False)
    no_traceback(p)
    assert "other users can write" in p.stderr
    home.chmod(0o700)
    db = open_dir / "shared.db"  # a store file named by --store: its tasks would run as root too
    shutil.copy(home / "fleet.db", db)
    db.chmod(0o666)
    p = fleet(home, "--store", f"sqlite:///{db}", "status", check=False)
    no_traceback(p)
    assert "refusing the store" in p.stderr and "chmod go-w" in p.stderr
    shutil.chown(home, user=other_user)
    p = fleet(home, "status", check=False)
    no_traceback(p)
    assert f"belongs to {other_user}" in p.stderr


# -- 19: bad input is one clear line, exit 1 ---------------------------------------------------------
def test_bad_input_is_one_clear_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    chain = "".join(
        f'[[task]]\nname = "t{i}"\nprompt = "p"\ncoder = "sim"\n'
        + (f'depends_on = ["t{i - 1}"]\n' if i else "")
        for i in range(1500)
    )
    (tmp_path / "chain.toml").write_text(chain)
    assert fleet(home, "validate", str(tmp_path / "chain.toml")).returncode == 0
    fleet(home, "load", str(tmp_path / "chain.toml"))
    graph = fleet(home, "status", "--graph").stdout.splitlines()
    assert len(graph) == 1500 and "t1499 [queued]" in graph[-1]

    def bad_file(body: str, expect: str) -> None:
        f = tmp_path / "bad.toml"
        f.write_text(body)
        p = fleet(home, "validate", str(f), check=False)
        assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
        assert expect in p.stderr, p.stderr

    task = '[[task]]\nname = "x"\nprompt = "p"\ncoder = "sim"\n'
    bad_file("a = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply")
    bad_file(task + "priority = 99999999999999999999999\n", "priority must be between")
    bad_file(task + "timeout_min = 1e400\n", "timeout_min must be a finite number")
    bad_file(task.replace('"x"', '"t-0190ab12cd34ef"'), "looks like a task id")
    bad_file(task.replace('"p"', '"a\\u0000b"'), "NUL byte")
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "-c",
            "user.email=a@b",
            "-c",
            "user.name=a",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "x",
        ],
        check=True,
    )
    bad_file(task + f'cwd = "{repo}"\ngit_ref = "HEAD@{{u}}"\n', "git_ref 'HEAD@{u}'")

    for args, expect in (
        (("add", "p", "--coder", "sim", "--budget-usd", "nan"), "budget_usd must be a finite number"),
        (("add", "p", "--coder", "sim", "--priority", "99999999999999999999999"), "priority must be between"),
        (("--store", "postgresql://u:secret@h:notaport/db", "status"), "bad store URL"),
        (("validate", "/dev/zero"), "not a regular file"),
        (("add", "  "), "the prompt is empty: say what the agent should do"),
    ):
        p = fleet(home, *args, check=False)
        assert p.returncode == 1 and "Traceback" not in p.stderr and expect in p.stderr, (args, p.stderr)
        assert "secret" not in p.stderr

    # a database damaged after it was opened: one line, no traceback
    db = home / "fleet.db"
    size = db.stat().st_size
    with open(db, "r+b") as fh:
        fh.seek(8192)
        fh.write(os.urandom(size - 8192))
    for command in (("status",), ("logs", "t3")):
        p = fleet(home, *command, check=False)
        no_traceback(p)
        assert "malformed" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def status_as_is(home: Path, **kw: Any) -> subprocess.CompletedProcess[str]:
    """`fleet-tui --home HOME status` on the home as it is (``fleet`` makes a quiet one first)."""
    return subprocess.run(
        [*FLEET, "--home", str(home), "status"],
        capture_output=True,
        text=True,
        timeout=60,
        env=fleet_env(home),
        **kw,
    )


def test_a_home_that_is_a_file_is_named_as_such(tmp_path: Path) -> None:
    """``--home`` (or FLEET_HOME) naming a file: one line that says so; it said only "File
    exists", mkdir's word for it."""
    home = tmp_path / "notes.txt"
    home.write_text("not a folder\n")
    p = status_as_is(home)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert f"cannot use the fleet home {home}: it is a file, not a folder" in p.stderr, p.stderr
    assert home.read_text() == "not a folder\n"


def test_config_set_on_a_read_only_home_is_one_line(tmpfs: Path) -> None:
    home = tmpfs / "home"
    home.mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    p = subprocess.run(
        [*FLEET, "--home", str(home), "config", "set", "max_concurrent", "3"],
        capture_output=True,
        text=True,
        timeout=60,
        env=fleet_env(home),
    )
    no_traceback(p)
    assert "cannot write" in p.stderr and "Read-only file system" in p.stderr


# -- 20: logs shows every event, in order ------------------------------------------------------------
def test_logs_streams_every_event(tmp_path: Path) -> None:
    home = tmp_path / "home"
    st, tid = store_with_task(home)
    n = 12_000
    evs = [Event(tid, 1, i, 1000.0 + i, "text", text=f"line {i}") for i in range(n - 1)]
    evs.append(Event(tid, 1, n - 1, 1000.0 + n, "result", text="FINAL RESULT"))
    st.append_events(evs)
    st.close()
    out = fleet(home, "logs", "hostile").stdout.splitlines()
    assert len(out) == n and out[-1].endswith("FINAL RESULT")
    assert [ln.rsplit(" ", 1)[-1] for ln in out[:3]] == ["0", "1", "2"]
    js = fleet(home, "logs", "hostile", "--json").stdout.splitlines()
    assert len(js) == n and json.loads(js[-1])["text"] == "FINAL RESULT"


def test_logs_raw_streams_a_big_file(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _, tid = store_with_task(home)
    d = attempt_dir(home, tid, 1)
    d.mkdir(parents=True, exist_ok=True)
    line = b'{"type":"text","text":"' + b"x" * 1000 + b'"}\n'
    with open(d / "stdout.jsonl", "wb") as fh:
        for _ in range(160):
            fh.write(line * 1000)  # 160 MB
    probe = (
        "import resource, subprocess, sys; "
        "p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
        "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, *FLEET, "--home", str(home), "logs", "hostile", "--raw"],
        capture_output=True,
        text=True,
        timeout=120,
        env=fleet_env(home),
    ).stdout.split()
    assert out[0] == "0"
    assert int(out[1]) < 100 * 1024, f"peak RSS {int(out[1]) // 1024} MiB for a 160 MB file"


# -- 21: a config path at /dev/zero or a huge file is refused, not read ----------------------------------
def test_config_at_dev_zero_or_huge_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").symlink_to("/dev/zero")

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    p = status_as_is(home, preexec_fn=limit)
    no_traceback(p)
    assert "not a regular file" in p.stderr
    (home / "config.toml").unlink()
    (home / "config.toml").write_text("# " + "x" * (2 << 20) + "\n")
    p = fleet(home, "status", check=False)
    no_traceback(p)
    assert "larger than" in p.stderr


def test_readonly_sqlite_open_writes_nothing(tmp_path: Path) -> None:
    """Opening a current store to read changes nothing in the file (no migration, no write)."""
    home = tmp_path / "home"
    st, _ = store_with_task(home)
    st.close()
    before = (home / "fleet.db").read_bytes()
    ro = SqliteStore(str(home / "fleet.db"), readonly=True)
    assert [t.name for t in ro.list_tasks()] == ["hostile"]
    with pytest.raises(Exception, match=r"write|readonly"):
        ro.set_setting("x", "1")
    ro.close()
    assert (home / "fleet.db").read_bytes() == before
    with pytest.raises(sqlite3.Error):
        sqlite3.connect(f"file:{home}/nope.db?mode=ro", uri=True).execute("SELECT 1 FROM x")


@pytest.mark.postgres
def test_read_only_commands_work_with_a_read_only_postgres_role(tmp_path: Path) -> None:
    """Opening a current PostgreSQL store takes no lock and writes nothing: a role that may only
    read (a dashboard's, an auditor's) can run the read-only commands."""
    import uuid

    import psycopg
    from psycopg import sql

    from fleet_tui.scheduler.store.opener import open_store

    pg_url = os.environ.get("FLEET_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
    try:
        psycopg.connect(pg_url, connect_timeout=3).close()
    except psycopg.Error as e:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"PostgreSQL at {pg_url} is unreachable ({e}); set FLEET_TEST_PG_URL")
    schema = f"fleet_test_{uuid.uuid4().hex[:12]}"
    role = f"fleet_ro_{uuid.uuid4().hex[:8]}"
    st = open_store(f"{pg_url}?schema={schema}", str(tmp_path))
    st.add_tasks([TaskSpec(name="ro-task", prompt="p", cwd=str(tmp_path), coder="sim")], time.time())
    st.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), sql.Identifier(role))
        )
        conn.execute(
            sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(
                sql.Identifier(schema), sql.Identifier(role)
            )
        )
    try:
        ro_url = pg_url.replace("postgres@", f"{role}@", 1) + f"?schema={schema}"
        home = tmp_path / "home"
        for args in (("status",), ("questions",), ("hosts",), ("logs", "ro-task")):
            p = fleet(home, "--store", ro_url, *args, check=False)
            assert p.returncode == 0, (args, p.stderr)
        assert "ro-task" in fleet(home, "--store", ro_url, "status").stdout
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
