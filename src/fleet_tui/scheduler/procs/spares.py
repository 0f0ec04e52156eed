"""Attempt folders made ahead of time, so that starting an agent makes none.

Why it exists: a new file or folder is cheap on most disks but not everywhere. On the
development machine's ext4 (no journal: the kernel skips the inodes freed in the last seconds)
one costs 0.1-0.5 ms of CPU, and on an NFS home each is a round trip to the server. A first
attempt makes three folders (``tasks/<id>/attempts/1``) and five files around its agent's
start, all between one agent's end and the next one's start. The shims' fork server
(``shim.zygote``) keeps a few *spares* under ``<home>/spare/`` while the agents run: each is
``<name>/attempts/1/`` holding the files every attempt makes, empty as each is before it is
written (and the exit record's space set aside). The engine moves one into place with a single
rename: the whole ``<name>`` as ``tasks/<id>`` for a first attempt, its ``attempts/1`` as
``tasks/<id>/attempts/<n>`` for a later one (the husk left behind is filled again by the
server). Readers see the same folder they always did. With no spare at hand (the server is busy
or gone, another engine took the last one, a home on two file systems) the folder is made as
before.

A spare is made under a dot name and renamed into view only when complete, and taken by a
rename, which only one taker wins: engines sharing a home never share a spare, and none sees a
spare half made.

Standard library only, no fleet-tui imports: the fork server imports it bare from this folder.
"""

from __future__ import annotations

import errno
import os

try:
    from . import attemptfiles as files
    from . import proctree
except ImportError:  # run as a bare module from this folder (the fork server): no package
    import attemptfiles as files  # type: ignore[no-redef]
    import proctree  # type: ignore[no-redef]

#: the spares' folder in a fleet home
SPARE_DIR = "spare"
#: spares kept ready at most (two per slot up to this: ShimPool.for_home)
MOST = 8
#: the files of a spare attempt folder: every attempt makes them, and each is empty until written
#: (``shim.json`` is written through its ``.tmp`` twin, then renamed; an empty ``lease`` reads
#: as no lease, as it always did between its creation and its first deadline)
EMPTY_FILES = (files.STDOUT, files.STDERR, files.PROMPT, files.SHIM_JSON + ".tmp", files.LEASE)
_INNER = os.path.join("attempts", "1")


def _fill(top: str) -> None:
    """``top/attempts/1`` with its empty files and the exit record's reserved space."""
    attempts = os.path.join(top, "attempts")
    try:
        os.mkdir(attempts, 0o700)
    except FileExistsError:
        pass
    inner = os.path.join(attempts, "1")
    os.mkdir(inner, 0o700)
    for name in EMPTY_FILES:
        os.close(os.open(os.path.join(inner, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    files.reserve_exit(inner)


def _name() -> str:
    return f"{os.getpid()}-{os.urandom(4).hex()}"


def _remove(path: str) -> None:
    """Remove a spare's folder and what is in it (best effort; spares hold no one's data).
    Not ``shutil.rmtree``: importing ``shutil`` costs the fork server more than this walk."""
    try:
        for top, dirs, names in os.walk(path, topdown=False):
            for name in names:
                os.unlink(os.path.join(top, name))
            for name in dirs:
                os.rmdir(os.path.join(top, name))
        os.rmdir(path)
    except OSError:
        pass


def _maker_gone(name: str) -> bool:
    """A half-made spare (``.<pid>-<hex>``) whose maker is no longer running."""
    try:
        pid = int(name[1:].split("-", 1)[0])
    except ValueError:
        return True
    return pid != os.getpid() and not proctree.alive(pid, None)


def top_up(root: str, want: int) -> int:
    """Make spares under ``root`` until ``want`` are ready (husks left by later attempts are
    filled again first); how many it made or filled. ``root`` itself is made when missing, but
    never its parent: a fleet home deleted under a running server is not made again. Any error
    (no room, the home gone) stops it quietly: spares are only ever a shortcut."""
    made = 0
    try:
        try:
            names = os.listdir(root)
        except FileNotFoundError:
            os.mkdir(root, 0o700)
            names = []
        ready = 0
        husks: list[str] = []
        for name in names:
            if name.startswith("."):  # being made, or left half made by a server that died
                if _maker_gone(name):
                    _remove(os.path.join(root, name))
                continue
            if os.path.isdir(os.path.join(root, name, _INNER)):
                ready += 1
            else:
                husks.append(name)
        while ready < want:
            tmp = os.path.join(root, "." + _name())
            if husks:
                try:  # taken back from view first: nobody may take it half filled
                    os.rename(os.path.join(root, husks.pop()), tmp)
                except FileNotFoundError:
                    continue  # an engine took it meanwhile
            else:
                os.mkdir(tmp, 0o700)
            try:
                _fill(tmp)
                os.rename(tmp, os.path.join(root, _name()))
            except OSError:
                _remove(tmp)  # a full disk, say: nothing half made is left behind
                raise
            ready += 1
            made += 1
    except OSError:
        pass
    return made


class Spares:
    """The engine's side: takes spares under ``root`` (``<home>/spare``) into place."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.off = False  # the spares cannot be moved where attempts go (another file system)
        self._names: list[str] = []

    def _next(self) -> str | None:
        if not self._names:
            try:
                self._names = [n for n in os.listdir(self.root) if not n.startswith(".")]
            except OSError:
                return None
        return self._names.pop() if self._names else None

    def take(self, adir: str) -> bool:
        """Move a spare into place as the attempt folder ``adir`` (``tasks/<id>/attempts/<n>``,
        whose parents may not exist yet); False when none could be (make it instead)."""
        if self.off:
            return False
        attempts = os.path.dirname(adir)
        top = os.path.dirname(attempts)
        first = os.path.basename(adir) == "1"
        for _ in range(4):  # a spare another engine took meanwhile: the next one
            name = self._next()
            if name is None:
                return False
            spare = os.path.join(self.root, name)
            if first and self._move(spare, top):
                if not os.path.isdir(adir):  # a husk: its attempt folder is still to make
                    os.makedirs(adir, 0o700, exist_ok=True)
                return True
            if self.off:
                return False
            if self._move(os.path.join(spare, _INNER), adir):
                return True
            if self.off or os.path.isdir(adir):
                return False  # the folder is there already (made by the caller as before)
        return False

    def _move(self, src: str, dst: str) -> bool:
        """``rename(src, dst)``, making ``dst``'s parents when they are missing; False when
        ``src`` is gone or ``dst`` is taken (``self.off`` when it can never work)."""
        for attempt in range(2):
            try:
                os.rename(src, dst)
                return True
            except FileNotFoundError:
                parent = os.path.dirname(dst)
                if attempt or os.path.isdir(parent) or not os.path.exists(src):
                    return False
                os.makedirs(parent, 0o700, exist_ok=True)
            except OSError as e:
                if e.errno in (errno.EXDEV, errno.EPERM, errno.EACCES, errno.EROFS):
                    self.off = True
                return False  # ENOTEMPTY / EEXIST: dst is there already
        return False
