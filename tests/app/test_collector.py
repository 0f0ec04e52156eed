"""The garbage collector waits while a key is handled (app/collector.py): disabled by a key,
enabled again by itself after the hold, and never left disabled by an app that closes."""

from __future__ import annotations

import asyncio
import gc

from fleet_tui.app.collector import CollectorHold

from . import scenarios as sc
from .helpers import wait_for


async def test_a_key_holds_the_collector_off_until_the_hold_ends() -> None:
    hold = CollectorHold(hold=0.05, most=5.0)
    assert gc.isenabled()
    hold.key()
    assert not gc.isenabled() and hold.holding
    for _ in range(500):  # ends by itself (a condition, bounded)
        if gc.isenabled():
            break
        await asyncio.sleep(0.01)
    assert gc.isenabled() and not hold.holding


async def test_keys_held_down_leave_the_collector_its_turn() -> None:
    hold = CollectorHold(hold=10.0, most=0.05)  # each key would hold for 10 s; one hold lasts 0.05
    hold.key()
    for _ in range(500):
        if gc.isenabled():
            break
        await asyncio.sleep(0.01)
        hold.key()  # a key every 10 ms
    assert gc.isenabled() and hold.holds == 1
    hold.key()  # after a longest hold, the next keys leave the collector be for a while
    assert gc.isenabled() and hold.holds == 1


async def test_a_collector_disabled_by_someone_else_is_left_to_them() -> None:
    hold = CollectorHold(hold=0.01)
    gc.disable()
    try:
        hold.key()
        assert not hold.holding
        hold.release()
        assert not gc.isenabled()  # not ours to enable
    finally:
        gc.enable()


async def test_the_cockpit_holds_the_collector_for_a_key_and_never_leaves_it_off() -> None:
    app = sc.make_app(sc.several_running())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("down")
        assert app.collector.holds == 1
        await wait_for(pilot, lambda: not app.collector.holding, "the hold's end")
        assert gc.isenabled()
        app.collector.hold = app.collector.most = 600.0
        await pilot.press("question_mark")
        assert app.collector.holding  # the app closes inside a hold: the collector comes back
    assert gc.isenabled()
