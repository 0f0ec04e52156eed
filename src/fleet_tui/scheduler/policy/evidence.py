"""Did an attempt do anything? The evidence that tells a false completion from an honest draft.

An agent that claims success while its verifiers fail is either an honest draft (it worked, the
work is not good enough yet) or a false completion (it did nothing and said it was done). Only
the second is counted as ``false_completions`` (DESIGN section 7). The proof is plain: no file of
the working directory changed while the attempt ran, or an artifact the task asks for does not
exist at all. Blocking (walks the directory); the engine calls it in a thread.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from fleet_tui.scheduler.model import VerifySpec

#: stop walking after this many entries: a huge tree is not proof of anything
WALK_LIMIT = 50_000
#: file times are compared with this much slack (coarse file-system clocks)
SLACK_S = 1.0
_SKIP_DIRS = {".git", "node_modules", ".venv", "__pycache__"}


def changed_since(workdir: Path, since: float, skip: Sequence[Path] = ()) -> bool | None:
    """True when a file or folder under ``workdir`` changed at or after ``since``; False when
    none did; None when it cannot be told (no such folder, or too many files to look at)."""
    root = Path(workdir)
    if not root.is_dir():
        return None
    skipped = {os.path.realpath(p) for p in skip}
    seen = 0
    for dirpath, dirnames, filenames in os.walk(root):
        if os.path.realpath(dirpath) in skipped:
            dirnames[:] = []
            continue
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        for name in (*filenames, *dirnames):
            seen += 1
            if seen > WALK_LIMIT:
                return None
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if max(st.st_mtime, st.st_ctime) >= since - SLACK_S:
                return True
    return False


def missing_artifacts(specs: Sequence[VerifySpec], workdir: Path) -> list[str]:
    """Artifacts the task asks for that do not exist at all."""
    root = Path(workdir)
    return [v.path or "" for v in specs if v.kind == "artifact" and not (root / (v.path or "")).exists()]


def nothing_done(specs: Sequence[VerifySpec], workdir: Path, since: float, skip: Sequence[Path] = ()) -> bool:
    """The evidence says the attempt did nothing: an asked-for artifact is missing, or no file of
    the working directory changed since the attempt started."""
    if missing_artifacts(specs, workdir):
        return True
    return changed_since(workdir, since, skip) is False
