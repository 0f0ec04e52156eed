"""Spare attempt folders (procs/spares.py): made ahead by the shims' server, moved into place by
one rename, and the attempt folder they become is the one an attempt always had."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from tests.helpers import fleet, quiet_home, wait_for

from fleet_tui.scheduler.procs import attemptfiles as files
from fleet_tui.scheduler.procs import spares
from fleet_tui.scheduler.procs.invoke import ShimPool
from fleet_tui.scheduler.procs.spares import Spares, top_up

pytestmark = pytest.mark.timeout(60)


def _ready(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if not p.name.startswith(".") and (p / "attempts" / "1").is_dir())


def _assert_fresh(adir: Path) -> None:
    """An attempt folder as a spare brings it: its files there and empty, the exit space set aside."""
    for name in spares.EMPTY_FILES:
        assert (adir / name).read_bytes() == b"", name
    assert (adir / files.EXIT_RESERVED).stat().st_size == files.EXIT_RESERVE
    assert oct((adir / files.LEASE).stat().st_mode & 0o777) == oct(0o600)
    assert oct(adir.stat().st_mode & 0o777) == oct(0o700)


def test_top_up_makes_spares_whole_and_never_makes_a_deleted_home(tmp_path: Path) -> None:
    root = tmp_path / "home" / "spare"
    (tmp_path / "home").mkdir()
    assert top_up(str(root), 3) == 3
    ready = _ready(root)
    assert len(ready) == 3 and len(list(root.iterdir())) == 3  # no half-made ".name" left
    for p in ready:
        _assert_fresh(p / "attempts" / "1")
    assert top_up(str(root), 3) == 0  # enough already: nothing made
    gone = tmp_path / "gone" / "spare"
    assert top_up(str(gone), 2) == 0
    assert not gone.parent.exists()  # a home deleted under the server is not made again


def test_a_first_attempt_takes_a_whole_spare_and_a_later_one_its_inner_folder(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    root = home / "spare"
    top_up(str(root), 2)
    before = {p.stat().st_ino for p in _ready(root)}
    taker = Spares(str(root))
    first = home / "tasks" / "t-1" / "attempts" / "1"  # tasks/ itself does not exist yet
    assert taker.take(str(first))
    assert first.parent.parent.stat().st_ino in before  # the spare itself, moved
    _assert_fresh(first)
    second = home / "tasks" / "t-1" / "attempts" / "2"
    assert taker.take(str(second))
    _assert_fresh(second)
    assert sorted(p.name for p in first.parent.iterdir()) == ["1", "2"]
    assert _ready(root) == []  # one taken whole, one left as a husk
    assert len(list(root.iterdir())) == 1
    assert top_up(str(root), 2) == 2  # the husk filled again, and one more
    assert len(list(root.iterdir())) == 2 and len(_ready(root)) == 2


def test_a_task_folder_that_exists_gets_the_inner_folder(tmp_path: Path) -> None:
    home = tmp_path / "home"
    top = home / "tasks" / "t-1"
    top.mkdir(parents=True)
    (top / "worktree.json").write_text("{}")  # made by the preparation before the attempt's folder
    top_up(str(home / "spare"), 1)
    adir = top / "attempts" / "1"
    assert Spares(str(home / "spare")).take(str(adir))
    _assert_fresh(adir)
    assert (top / "worktree.json").read_text() == "{}"


def test_no_spare_or_one_taken_by_another_engine_falls_back(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    root = home / "spare"
    adir = home / "tasks" / "t-1" / "attempts" / "1"
    assert not Spares(str(root)).take(str(adir))  # no spare folder at all
    top_up(str(root), 1)
    mine, theirs = Spares(str(root)), Spares(str(root))
    assert theirs.take(str(home / "tasks" / "t-2" / "attempts" / "1"))
    assert not mine.take(str(adir))  # the one it saw is gone: none left
    assert not adir.exists()
    top_up(str(root), 1)
    adir.mkdir(parents=True)
    (adir / "note").write_text("kept")
    assert not mine.take(str(adir))  # a folder with something in it: left as it is, spare kept
    assert (adir / "note").read_text() == "kept"
    assert len(_ready(root)) == 1
    (adir / "note").unlink()
    assert mine.take(str(adir))  # an empty one is replaced by the spare (rename's own rule)
    _assert_fresh(adir)


def test_the_first_lease_goes_into_the_empty_file_but_never_over_a_renewal(tmp_path: Path) -> None:
    lease = tmp_path / files.LEASE
    assert files.first_lease(str(lease), 100.0)  # no file: made
    assert lease.read_text() == "100.000\n"
    assert not files.first_lease(str(lease), 50.0)
    lease.write_bytes(b"")  # a spare's empty lease
    assert files.first_lease(str(lease), 200.0)
    assert lease.read_text() == "200.000\n"
    lease.write_bytes(b"")
    files.write_deadline(str(tmp_path), 300.0)  # its supervisor renewed it first: replaced whole
    assert not files.first_lease(str(lease), 250.0)
    assert lease.read_text() == "300.000\n"


def test_the_shims_server_keeps_spares_ready(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    root = home / "spare"
    pool = ShimPool(spare_root=str(root), spares=2)
    pool.fill()
    try:
        wait_for(lambda: len(_ready(root)) == 2, timeout=30, interval=0.02, what="two spares")
        taker = Spares(str(root))
        assert taker.take(str(home / "tasks" / "t-1" / "attempts" / "1"))
        got = pool.spawn(["--dir", str(tmp_path), "--cwd", str(tmp_path), "--", "true"], {})
        assert got is not None  # the server hears "n" after a start and makes another spare
        wait_for(lambda: len(_ready(root)) == 2, timeout=30, interval=0.02, what="the spare replaced")
    finally:
        pool.close()


def test_attempts_run_in_spare_folders_left_by_an_earlier_run(tmp_path: Path) -> None:
    home = quiet_home(tmp_path / "home")
    top_up(str(home / "spare"), 4)  # as many as a 2-slot engine's server keeps: none made anew
    made = {p.stat().st_ino for p in _ready(home / "spare")}
    spec = tmp_path / "t.toml"
    spec.write_text(
        '[defaults]\ncoder = "shell"\n'
        '[[task]]\nname = "a"\nprompt = "pa"\ncommand = "echo out-$FLEET_TASK_NAME; cat >&2"\n'
        '[[task]]\nname = "b"\nprompt = "pb"\ncommand = "echo out-$FLEET_TASK_NAME; cat >&2"\n'
    )
    fleet(home, "load", str(spec))
    started = time.time()
    fleet(home, "run", "--until-idle", "--max-concurrent", "2")
    tasks = {t["name"]: t for t in json.loads(fleet(home, "status", "--json").stdout)}
    assert {n: t["status"] for n, t in tasks.items()} == {"a": "done", "b": "done"}
    for name, t in tasks.items():
        top = home / "tasks" / t["id"]
        assert top.stat().st_ino in made  # a spare from before, moved into place
        adir = top / "attempts" / "1"
        assert (adir / files.STDOUT).read_text() == f"out-{name}\n"
        prompt = (adir / files.PROMPT).read_text()
        assert prompt.startswith(f"p{name}\n")
        assert (adir / files.STDERR).read_text() == prompt  # the prompt, on stdin
        assert json.loads((adir / files.EXIT_JSON).read_text())["exit_code"] == 0
        assert json.loads((adir / files.SHIM_JSON).read_text())["started_at"] >= started - 1
        assert float((adir / files.LEASE).read_text()) > started
        assert sorted(os.listdir(adir)) == sorted(
            [files.STDOUT, files.STDERR, files.PROMPT, files.EXIT_JSON, files.SHIM_JSON, files.LEASE]
        )


def test_a_spare_that_cannot_be_made_whole_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "spare"
    root.mkdir()
    real = spares._fill

    def full_disk(top: str) -> None:
        real(top)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spares, "_fill", full_disk)
    assert top_up(str(root), 2) == 0
    assert list(root.iterdir()) == []


def test_half_made_spares_of_a_server_that_died_are_cleared(tmp_path: Path) -> None:
    root = tmp_path / "spare"
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = root / f".{dead.pid}-00000000"
    (stale / "attempts" / "1").mkdir(parents=True)
    (stale / "attempts" / "1" / "stdout.jsonl").write_text("")
    mine = root / f".{os.getpid()}-11111111"  # being made by a live server: left alone
    mine.mkdir()
    assert top_up(str(root), 1) == 1
    assert not stale.exists() and mine.exists()
    assert len(_ready(root)) == 1
