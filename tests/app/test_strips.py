"""strips.py: a strip divided where it ends, or cropped and extended to its own length, is the
answer textual gives, and is no longer kept inside itself (a cycle only the collector frees)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip

from fleet_tui.app import strips

RED = Style(color="red")


def lines() -> list[Strip]:
    return [
        Strip([Segment("hello "), Segment("world", RED)]),
        Strip([Segment("x" * 40, RED)]),
        Strip([Segment("ab"), Segment("cd", RED), Segment("ef")]),
        Strip([]),
    ]


@pytest.fixture(autouse=True)
def installed() -> None:
    strips.install()


def test_the_answers_are_textuals() -> None:
    divide = Strip.divide.__wrapped__  # type: ignore[attr-defined]
    crop_extend = Strip.crop_extend.__wrapped__  # type: ignore[attr-defined]
    for line in lines():
        n = line.cell_length
        for cuts in ([n], [0, n], [1, n], [n // 2, n], [n + 3], [2, 5, n], []):
            assert list(line.divide(cuts)) == list(divide(line, cuts)), cuts
        for start, end in ((0, n), (0, n + 4), (1, n), (0, max(n - 1, 0)), (2, n + 2), (n, n + 1)):
            assert line.crop_extend(start, end, RED) == crop_extend(line, start, end, RED), (start, end)
        assert line.divide([n]) == [line] and line.crop_extend(0, n, None) is line


@pytest.fixture
def no_collector() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def test_a_strip_divided_where_it_ends_or_cropped_to_itself_dies_when_dropped(no_collector: None) -> None:
    for _ in range(50):
        for line in lines():
            line.divide([line.cell_length])
            line.crop_extend(0, line.cell_length, None)
            line.divide([1, line.cell_length])  # a real cut: new strips, kept in the line
    assert gc.collect() == 0  # nothing was left for the collector: no strip held itself


def test_textuals_own_methods_leave_cycles(no_collector: None) -> None:
    """What the test above guards against (textual is pinned: if it stops caching the strip in
    itself, ``strips.py`` can go)."""
    divide = Strip.divide.__wrapped__  # type: ignore[attr-defined]
    for line in lines():
        divide(line, [line.cell_length])
    assert gc.collect() > 0
