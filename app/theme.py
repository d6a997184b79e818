"""The window's colours: the dark style sheet, or its light variant, chosen from the `theme` setting and the
desktop's colour scheme, following the desktop when it changes.

Invariants: resources/style.qss is the one style sheet; the light one is that sheet with each dark colour
swapped for its light counterpart (`LIGHT`), so a rule added to the sheet is themed in both; every colour the
sheet uses has a counterpart (tests/test_app_theme.py checks it); the palette and the sheet always change together.
"""

from __future__ import annotations

import re

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

from .resources import stylesheet

# dark colour of resources/style.qss -> the light theme's (GitHub light-like: white panes, grey lines, blue accent)
LIGHT = {
    "#0d1117": "#ffffff", "#0b0f14": "#f6f8fa", "#11161d": "#f6f8fa", "#161b22": "#f6f8fa", "#1c2129": "#fff8e6",
    "#1c2333": "#eef3fc", "#1f2a44": "#ddeafc", "#21262d": "#eaeef2", "#262c36": "#d8dee4", "#26355a": "#c8dcf8",
    "#2d3340": "#dfe5eb", "#2d3b5e": "#b6cff5", "#2d4a7a": "#b6d4fe", "#30363d": "#d0d7de", "#3a3020": "#e8d9a8",
    "#e6edf3": "#1f2328", "#c9d1d9": "#24292f", "#8b949e": "#57606a", "#7d8590": "#656d76", "#6e7681": "#8c959f",
    "#7aa2f7": "#0969da", "#58a6ff": "#0969da", "#2f81f7": "#0969da", "#3b5bdb": "#0969da", "#4c6ef5": "#0550ae",
    "#3fb950": "#1a7f37", "#2f7d43": "#2da44e", "#d29922": "#9a6700", "#9e6a03": "#bf8700", "#e3b341": "#7d4e00",
    "#2e2410": "#fff8c5", "#5c4410": "#d4a72c", "#3b1219": "#ffebe9", "#6e2130": "#ff8182", "#ffb3b8": "#82071e",
    "#ff7b72": "#cf222e", "#b62324": "#cf222e", "#16241c": "#dafbe1", "#2b5a3a": "#4ac26b",
}
THEMES = ("auto", "dark", "light")
_HEX = re.compile(r"#[0-9a-fA-F]{6}\b")

PALETTES = {
    "dark": {"Window": "#0d1117", "WindowText": "#e6edf3", "Base": "#0d1117", "AlternateBase": "#11161d",
             "Text": "#e6edf3", "Button": "#21262d", "ButtonText": "#e6edf3", "Highlight": "#2d4a7a",
             "HighlightedText": "#ffffff", "Link": "#7aa2f7", "ToolTipBase": "#161b22", "ToolTipText": "#e6edf3",
             "PlaceholderText": "#6e7681"},
    "light": {"Window": "#ffffff", "WindowText": "#1f2328", "Base": "#ffffff", "AlternateBase": "#f6f8fa",
              "Text": "#1f2328", "Button": "#eaeef2", "ButtonText": "#1f2328", "Highlight": "#b6d4fe",
              "HighlightedText": "#1f2328", "Link": "#0969da", "ToolTipBase": "#f6f8fa", "ToolTipText": "#1f2328",
              "PlaceholderText": "#8c959f"},
}


def sheet_colours(sheet: str) -> set[str]:
    return {c.lower() for c in _HEX.findall(sheet)}


def light_sheet(dark: str) -> str:
    """The light variant of a dark style sheet (colours swapped; `white` text on buttons kept)."""
    return _HEX.sub(lambda m: LIGHT.get(m.group(0).lower(), m.group(0)), dark)


def scheme_for(mode: str, desktop: Qt.ColorScheme) -> str:
    """"dark" or "light": the setting when it names one, else the desktop's (dark when it says nothing)."""
    if mode in ("dark", "light"):
        return mode
    return "light" if desktop == Qt.ColorScheme.Light else "dark"


def current_scheme() -> str:
    """The scheme applied now ("dark" before any was)."""
    app = QApplication.instance()
    return (app.property("evokeTheme") if app is not None else None) or "dark"


def tone(dark: str, light: str) -> str:
    """The colour for a widget painting itself (a delegate): `dark` or `light` after the scheme applied now."""
    return light if current_scheme() == "light" else dark


def palette(scheme: str) -> QPalette:
    pal = QPalette()
    for role, colour in PALETTES[scheme].items():
        pal.setColor(getattr(QPalette.ColorRole, role), QColor(colour))
    return pal


def apply_scheme(app: QApplication, scheme: str) -> None:
    sheet = stylesheet()
    app.setPalette(palette(scheme))
    app.setStyleSheet(light_sheet(sheet) if scheme == "light" else sheet)
    app.setProperty("evokeTheme", scheme)


class ThemeFollower(QObject):
    """Applies the theme the setting and the desktop choose, again when either changes."""

    changed = Signal(str)          # "dark" | "light", after it was applied

    def __init__(self, mode: str = "auto", parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.mode = mode if mode in THEMES else "auto"
        self.scheme = ""
        hints = QGuiApplication.styleHints()
        self.desktop = hints.colorScheme()
        hints.colorSchemeChanged.connect(self.desktop_changed)
        self.apply()

    def set_mode(self, mode: str) -> None:
        self.mode = mode if mode in THEMES else "auto"
        self.apply()

    def desktop_changed(self, scheme: Qt.ColorScheme) -> None:
        self.desktop = scheme
        self.apply()

    def apply(self) -> None:
        """Apply the chosen scheme unless it is the one in effect (the dark sheet `make_application` set)."""
        scheme = scheme_for(self.mode, self.desktop)
        app = QApplication.instance()
        if not isinstance(app, QApplication):
            return
        self.scheme = scheme
        if scheme != current_scheme():
            apply_scheme(app, scheme)
            self.changed.emit(scheme)
