"""The command palette (ctrl+p) provider: every cockpit action, searchable by name.

It lists the same actions as the key bindings (read from the app's binding table), so a user who
forgets a key can still find the command, and the palette never offers something the keys can't.
"""

from __future__ import annotations

from functools import partial
from typing import Protocol, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider


class ActionTable(Protocol):
    """What the palette needs of the app (``FleetApp``): its keys, actions and descriptions."""

    def action_table(self) -> list[tuple[str, str, str]]: ...


class FleetCommands(Provider):
    def _actions(self) -> list[tuple[str, str, str]]:
        return cast(ActionTable, self.app).action_table()

    async def discover(self) -> Hits:
        for key, action, description in self._actions():
            yield DiscoveryHit(f"{description} ({key})", partial(self._run, action), help=f"key: {key}")

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for key, action, description in self._actions():
            label = f"{description} ({key})"
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, matcher.highlight(label), partial(self._run, action), help=f"key: {key}")

    async def _run(self, action: str) -> None:
        await self.app.run_action(action)
