"""``fleet-tui status --group repo`` through the real CLI: the cockpit's repository groups (same
roots, labels and order), while ``status`` and ``status --json`` keep their order and keys."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from fleet_tui.app.order import QueueModel
from fleet_tui.scheduler.store.sqlite_store import SqliteStore
from helpers import fleet


def make_repos(root: Path) -> dict[str, Path]:
    dirs = {
        "work-api": root / "work" / "api",
        "old-api": root / "old" / "api",
        "web": root / "web",
        "scratch": root / "scratch",  # not a git repository: its own group
    }
    for key, d in dirs.items():
        d.mkdir(parents=True)
        if key != "scratch":
            subprocess.run(["git", "init", "-q", str(d)], check=True)
    (dirs["web"] / "pkg").mkdir()
    return dirs


def test_status_group_repo_matches_the_cockpit(tmp_path: Path) -> None:
    dirs = make_repos(tmp_path / "src")
    tasks = [
        ("web-a", dirs["web"] / "pkg"),  # a subfolder: grouped under its repository's root
        ("api-a", dirs["work-api"]),
        ("old-a", dirs["old-api"]),
        ("note-a", dirs["scratch"]),
        ("web-b", dirs["web"]),
    ]
    toml = "".join(
        f'[[task]]\nname = "{name}"\nprompt = "x"\ncoder = "sim"\ncwd = "{cwd}"\n\n' for name, cwd in tasks
    )
    (tmp_path / "tasks.toml").write_text(toml)
    home = tmp_path / "home"
    fleet(home, "load", str(tmp_path / "tasks.toml"))

    plain = fleet(home, "status").stdout.splitlines()
    assert [line.split()[1] for line in plain] == [name for name, _ in tasks]  # order unchanged
    listed = json.loads(fleet(home, "status", "--json").stdout)
    assert [t["name"] for t in listed] == [name for name, _ in tasks]
    assert "repo" not in listed[0]  # the JSON contract is untouched

    grouped = fleet(home, "status", "--group", "repo").stdout.splitlines()
    headers = [line for line in grouped if not line.startswith("  ")]
    assert [h.split(" ")[0] for h in headers] == ["old/api", "scratch", "web", "work/api"]
    assert headers[2].startswith(f"web ({dirs['web']}) · 2 tasks · 2 queued")
    body: dict[str, list[str]] = {h: [] for h in headers}
    current = ""
    for line in grouped:
        if line.startswith("  "):
            body[current].append(line.split()[1])
        else:
            current = line
    assert body[headers[2]] == ["web-a", "web-b"]

    store = SqliteStore(str(home / "fleet.db"))
    try:
        model = QueueModel()
        model.replace_all(store.list_tasks())
    finally:
        store.close()
    cockpit = [model.label(r.ref) for r in model.rows() if r.kind == "group"]
    assert cockpit == [h.split(" ")[0] for h in headers]


def test_status_group_rejects_an_unknown_grouping(tmp_path: Path) -> None:
    p = fleet(tmp_path / "home", "status", "--group", "host", check=False)
    assert p.returncode == 2 and "invalid choice" in p.stderr
