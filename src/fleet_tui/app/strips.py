"""Screen lines that die when they are dropped, not when Python's cyclic collector gets to them.

Textual's ``Strip`` (one screen line) keeps what it derives from itself in caches of its own, and
two of its methods can derive the strip itself: ``divide`` where the strip already ends (the
compositor cuts every line of every widget at the edges of the widgets beside it, and most lines
have none inside them) and ``crop_extend`` to its own length (``RichLog`` crops each line it
shows to the pane's width, and the stream's lines are already cut to it). The strip then holds
itself: a reference cycle that reference counting cannot free. Under 32 agents at 200 events/s
the collector's middle generation held 3,300 strips and 23,000 of their caches (a strip keeps
seven), and its collections took 17-60 ms with the interpreter lock held: a key that landed in
one waited for all of it. With the cycles gone the collector had a quarter less work in a run of
that load (bench/README.md's notes).

``install()`` (once, by ``FleetApp``) gives ``Strip`` the two methods answering the strip itself
without caching it: what they return is the same (textual's own methods return that strip from
their cache), nothing else changes. Textual is pinned in pyproject.toml; an upgrade re-checks this
against ``Strip`` (tests/app/test_strips.py compares the answers with textual's own).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import wraps

from rich.style import Style
from textual.strip import Strip

_installed = False


def _divide(divide: Callable[[Strip, Iterable[int]], Sequence[Strip]]) -> Callable[..., Sequence[Strip]]:
    @wraps(divide)
    def without_self(self: Strip, cuts: Iterable[int]) -> Sequence[Strip]:
        cell_length = self.cell_length
        cuts = [cut for cut in cuts if cut <= cell_length]
        if cuts == [cell_length]:  # textual's answer, which it would keep in ``self``
            return [self]
        return divide(self, cuts)

    return without_self


def _crop_extend(crop_extend: Callable[[Strip, int, int, Style | None], Strip]) -> Callable[..., Strip]:
    @wraps(crop_extend)
    def without_self(self: Strip, start: int, end: int, style: Style | None) -> Strip:
        if start == 0 and end == self.cell_length:  # nothing to extend, nothing to crop: ``self``
            return self
        return crop_extend(self, start, end, style)

    return without_self


def install() -> None:
    """Give ``Strip`` the two methods that do not keep the strip in itself (idempotent; textual's
    own stay reachable as each one's ``__wrapped__``)."""
    global _installed
    if _installed:
        return
    _installed = True
    Strip.divide = _divide(Strip.divide)  # type: ignore[method-assign]
    Strip.crop_extend = _crop_extend(Strip.crop_extend)  # type: ignore[method-assign]
