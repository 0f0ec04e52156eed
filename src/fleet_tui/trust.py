"""What fleet-tui trusts: files read with a size cap, and paths no other user can write.

fleet-tui runs what its home says (a config's ``worktree_setup``, the tasks in its store) as the
user who starts it, so a home, config or store another user can write would let that user run
commands as this one — as root, for root. Like ssh, it refuses such paths with a message that says
what to ``chown`` or ``chmod``. And a config or task file is read with a cap: a path that points at
/dev/zero, a FIFO or a multi-gigabyte log must be refused, not read until memory runs out.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class TrustError(ValueError):
    """A path fleet-tui will not use; the message names it and how to fix it."""


def read_capped(path: Path, limit: int, what: str = "file") -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes.

    Raises FileNotFoundError when it is missing, TrustError when it is not a regular file (a
    device such as /dev/zero, a FIFO) or is larger than ``limit``: such a path is a mistake, and
    reading it whole would hang or fill memory."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise TrustError(f"{path}: the {what} is not a regular file: point it at a real file")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise TrustError(f"{path}: the {what} is larger than {limit // 1024} KiB: check the path")
    return data


def _user(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return f"uid {uid}"


def check_trusted(path: Path, what: str) -> None:
    """Refuse ``path`` (and every folder above it) when another user could change it, as ssh does.

    fleet-tui runs what its home says (a config's ``worktree_setup``, the tasks in its store) as
    the user who starts it: a home or config another user can write would let that user run
    commands as this one (as root, for root). Allowed owners: this user and root; a folder above
    may be writable by others only when it is sticky (like /tmp). A missing ``path`` is fine."""
    uid = os.geteuid()
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return
    except OSError as e:
        raise TrustError(f"cannot check {what} {path}: {e}") from None
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise TrustError(f"{path}: {what} is not a regular file ({real}): point it at a real file")
    current, top = real, True
    while True:
        if st.st_uid not in (uid, 0):
            raise TrustError(
                f"refusing {what} {path}: {current} belongs to {_user(st.st_uid)}, not to you "
                f"({_user(uid)}), who could make fleet-tui run commands as you. Use a home of your own "
                f"(--home DIR), or if it is yours: chown {_user(uid)} {current}"
            )
        sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if st.st_mode & 0o022 and (top or not sticky_dir):
            raise TrustError(
                f"refusing {what} {path}: other users can write {current} "
                f"(mode {stat.S_IMODE(st.st_mode):04o}) and could make fleet-tui run commands as you. "
                f"Fix it: chmod go-w {current}"
            )
        parent = os.path.dirname(current)
        if parent == current:
            return
        current, top = parent, False
        try:
            st = os.stat(current)
        except OSError as e:
            raise TrustError(f"cannot check {what} {path}: {e}") from None
