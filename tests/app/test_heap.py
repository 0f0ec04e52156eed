"""The cockpit's collector settings (``FleetApp._settle_heap``: the start-up heap frozen, a larger
young generation) hold only while it runs: the process gets Python's own back when it exits."""

from __future__ import annotations

import gc

from fleet_tui.app.app import GC_YOUNG

from . import scenarios as sc


async def test_the_collector_settings_are_given_back_on_exit() -> None:
    threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
    app = sc.make_app(sc.several_running())
    async with app.run_test(size=(120, 40)):
        app._settle_heap()  # what the timer does FREEZE_SECONDS after mount
        assert gc.get_threshold() == (max(GC_YOUNG, threshold[0]), *threshold[1:])
        assert gc.get_freeze_count() > frozen
        app._settle_heap()  # once only
    assert gc.get_threshold() == threshold
    assert gc.get_freeze_count() == frozen
