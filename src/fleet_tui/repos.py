"""Which repository a task belongs to, for grouping: the cockpit's queue and ``status --group repo``.

A fleet spans many repositories; a person thinks of the backlog per repository. A task's
repository is the git root of its ``cwd`` (the nearest folder up with a ``.git``), or the
``cwd`` itself for a task outside git. Labels are the folder names, made unique with parent
folders where two repositories share a name. Nothing here imports Textual or Rich.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from functools import lru_cache


@lru_cache(maxsize=4096)
def repo_root(cwd: str) -> str:
    """The git root holding ``cwd`` (the nearest folder with a ``.git``), else ``cwd`` itself.

    Cached per folder: a fleet has many tasks but few distinct folders."""
    path = os.path.abspath(cwd or ".")
    probe = path
    while True:
        if os.path.exists(os.path.join(probe, ".git")):
            return probe
        parent = os.path.dirname(probe)
        if parent == probe:
            return path
        probe = parent


def repo_labels(roots: Iterable[str]) -> dict[str, str]:
    """A short, unique label per repository root: its folder name, with parents added until no
    two roots share a label (``/x/work/api`` and ``/x/old/api`` become ``work/api`` and ``old/api``)."""
    ordered = sorted(set(roots))
    depth = dict.fromkeys(ordered, 1)
    while True:
        labels = {r: "/".join(r.rstrip("/").split("/")[-depth[r] :]) or "/" for r in ordered}
        seen: dict[str, list[str]] = {}
        for r, label in labels.items():
            seen.setdefault(label, []).append(r)
        grown = [r for group in seen.values() if len(group) > 1 for r in group if labels[r] != r]
        if not grown:
            return labels
        for r in grown:
            depth[r] += 1


#: how urgent a task's state is for the person, most urgent first (``asking`` outranks the rest)
URGENCY = {
    "asking": 0,
    "needs_human": 0,
    "running": 1,
    "verifying": 1,
    "paused": 2,
    "queued": 3,
    "done": 4,
    "cancelled": 4,
}


def urgency(status: str, asking: bool = False) -> int:
    """0 needs the person, 1 running/verifying, 2 paused, 3 queued, 4 finished."""
    if asking and URGENCY.get(status, 3) < 4:
        return 0
    return URGENCY.get(status, 3)


def group_order(labels: dict[str, str], urgencies: dict[str, int] | None = None) -> list[str]:
    """Repository roots in the order both views list them: repositories with a task that needs
    the person first, then with running tasks, and so on (the most urgent task of each), then by
    label and path. A group moves only when its most urgent task changes band."""
    urg = urgencies or {}
    return sorted(labels, key=lambda r: (urg.get(r, 3), labels[r].lower(), r))
