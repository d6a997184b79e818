"""View → Bigger text, Smaller text, Actual text size (Ctrl+Plus or Ctrl+=, Ctrl+Minus, Ctrl+0) and Ctrl+wheel
over the chat: the `text_size` setting, shown at once in the chat's text (app/text_size.py names what scales).

Invariants: the window's own style sheet holds the text size's font sizes and nothing else (colours stay the theme's
on the application); a change re-lays out what is shown (the same bubbles: no message, selection or draft is
lost) and the chat keeps its place (`ChatView.keep_place`); the size is saved through the controller at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QObject
from PySide6.QtGui import QAction, QKeySequence

from .resources import stylesheet
from .settings_form import field_specs
from .text_size import base_points, step, text_size_sheet

if TYPE_CHECKING:
    from .window import MainWindow

STATUS_MS = 2000          # how long the status bar says the size chosen


class TextSize(QObject):
    """The window's text size: its three actions, and the size shown now (`percent`)."""

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.window = window
        controller = window.controller
        spec = next(s for s in field_specs(type(controller.settings)) if s.name == "text_size")
        self.low, self.high, self.default = int(spec.low or 0), int(spec.high or 0), int(spec.default)
        self.bases = base_points(stylesheet())
        self.percent = 100                       # what the style sheet alone shows
        self.bigger_action = QAction("Bigger text", window, triggered=lambda: self.choose(self.next(1)))
        self.bigger_action.setShortcuts([QKeySequence("Ctrl++"), QKeySequence("Ctrl+=")])
        self.smaller_action = QAction("Smaller text", window, triggered=lambda: self.choose(self.next(-1)))
        self.smaller_action.setShortcut(QKeySequence("Ctrl+-"))
        self.reset_action = QAction("Actual text size", window, shortcut=QKeySequence("Ctrl+0"),
                                    triggered=lambda: self.choose(self.default))
        self.actions = (self.bigger_action, self.smaller_action, self.reset_action)
        for action in self.actions:
            window.addAction(action)              # the keys work with the menu bar hidden too
        window.chat.zoomRequested.connect(lambda direction: self.choose(self.next(direction)))
        self.show(controller.settings.text_size)
        controller.settingsApplied.connect(lambda settings: self.show(settings.text_size))

    def next(self, direction: int) -> int:
        return step(self.percent, direction, self.low, self.high)

    def choose(self, percent: int) -> None:
        """The user asked for `percent`: shown now, then saved (the controller announces it)."""
        if percent != self.percent:
            self.show(percent)
            self.window.controller.apply_window_setting("text_size", percent)
        self.window.status.showMessage(f"Text size {self.percent} %", STATUS_MS)

    def show(self, percent: int) -> None:
        if percent != self.percent:
            self.percent = percent
            self.window.chat.keep_place()
            self.window.setStyleSheet(text_size_sheet(self.bases, percent))
        self.bigger_action.setEnabled(percent < self.high)
        self.smaller_action.setEnabled(percent > self.low)
        self.reset_action.setEnabled(percent != self.default)


def install_text_size(window: MainWindow) -> None:
    """`window.text_size`, its actions in the View menu (after what is there)."""
    window.text_size = TextSize(window)
    view_menu = next((a.menu() for a in window.menuBar().actions() if a.text() == "&View"), None)
    if view_menu is not None:
        view_menu.addSeparator()
        for action in window.text_size.actions:
            view_menu.addAction(action)
