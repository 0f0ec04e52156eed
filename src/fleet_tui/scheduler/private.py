"""Everything fleet-tui writes is private to the user who runs it.

The home holds prompts, raw agent output, per-run copies of the user's CLI configs (with their
tokens) and the store: nothing another user may read. Rather than a mode on each of the many
places that create a file (the store, the shim, every coder's per-run config), the fleet-tui
process runs with umask 077 (files 0600, folders 0700) and its agents get the user's own umask
back, so files an agent writes in the user's checkout keep the modes the user expects.
"""

from __future__ import annotations

import os

PRIVATE_UMASK = 0o077
_user_umask: int | None = None


def go_private() -> None:
    """Make every file and folder this process (and its children) creates private."""
    global _user_umask
    old = os.umask(PRIVATE_UMASK)
    if _user_umask is None:
        _user_umask = old


def user_umask() -> int:
    """The umask this process started with (the current one when go_private was not called)."""
    if _user_umask is not None:
        return _user_umask
    cur = os.umask(PRIVATE_UMASK)
    os.umask(cur)
    return cur
