"""Rich styles derived from the running Textual theme.

Widgets that write Rich ``Text`` (the stream, the detail log) colour it through theme variables
(``$text-warning``, ``$foreground-muted``, ...) resolved here, so a theme switch or a 256-colour
terminal changes every colour consistently and nothing is hard-coded.
"""

from __future__ import annotations

from functools import lru_cache

from rich.style import Style
from textual.app import App
from textual.color import Color


class ThemeStyles:
    """Resolve theme variable names to Rich styles (alpha blended onto the background)."""

    def __init__(self, app: App[object]) -> None:
        self._app = app
        self._theme: str | None = None
        self._variables: dict[str, str] = {}

    def _refresh(self) -> None:
        if self._theme != self._app.theme:
            self._theme = self._app.theme
            self._variables = self._app.get_css_variables()
            self._resolve.cache_clear()

    def __call__(self, variable: str) -> Style:
        self._refresh()
        return self._resolve(variable)

    @lru_cache(maxsize=64)  # noqa: B019 - one instance per widget, cleared on theme change
    def _resolve(self, variable: str) -> Style:
        value = self._variables.get(variable)
        if not value:
            return Style()
        try:
            color = Color.parse(value)
        except Exception:
            return Style()
        background = self._variables.get("background")
        if color.a < 1 and background:
            color = Color.parse(background) + color
        return Style(color=color.rich_color)
