"""Scripted demo runs for the docs: drive the real window and engine, then save a PNG and quit.

Invariant: a demo only uses the controller's public methods (as a user would); it fails with
exit code 1 and a message when the model does not load or a step takes too long.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Qt, QTimer
from PySide6.QtWidgets import QApplication

from .resources import demo_file
from .window import MainWindow


@dataclass
class DemoTurn:
    text: str
    files: list[str] = field(default_factory=list)
    max_tokens: int = 96


MAIN_DEMO = [DemoTurn("Explain RingBuffer briefly, then show a usage example in a python code block.",
                      ["ring_buffer.py"], 130)]
ACTIONS_DEMO = [DemoTurn("Write a python function that reverses a string, in a code block.", [], 60)]
MEMORY_DEMO = [DemoTurn("Summarize this configuration file in one sentence.", ["gateway_config.py"], 48),
               DemoTurn("Which port does the cache section use?", [], 32),
               DemoTurn("Now list three sections of the file.", ["ring_buffer.py"], 40)]


class DemoDirector(QObject):
    """Waits for the model and an open conversation, plays the turns, then grabs `target`."""

    def __init__(self, window: MainWindow, turns: list[DemoTurn], path: str, target: str = "window",
                 timeout_s: int = 600) -> None:
        super().__init__(window)
        self.window, self.turns, self.path, self.target = window, list(turns), path, target
        self.controller = window.controller
        self.started = False
        self.failed = ""
        self.controller.currentChanged.connect(self._maybe_start)
        self.controller.modelStateChanged.connect(self._model_state)
        self.controller.generatingChanged.connect(self._generating)
        QTimer.singleShot(timeout_s * 1000, lambda: self._fail(f"demo timed out after {timeout_s} s"))

    def _model_state(self, state: str, detail: str) -> None:
        if state == "failed":
            self._fail(f"model failed to load: {detail}")
        self._maybe_start()

    def _maybe_start(self, *_: object) -> None:
        if self.started or self.controller.model_state != "ready" or self.controller.conv is None:
            return
        self.started = True
        QTimer.singleShot(200, self._next)

    def _next(self) -> None:
        if not self.turns:
            self.controller.refresh_stats()
            QTimer.singleShot(900, self._shoot)
            return
        turn = self.turns.pop(0)
        for name in turn.files:
            self.controller.attach_file(str(demo_file(name)))
        self.window.input.prompt.setPlainText(turn.text)
        if not self.controller.send(turn.text, max_tokens=turn.max_tokens, temperature=0.0):
            self._fail("the demo message could not be sent")
        else:
            self.window.input.clear()

    def _generating(self, generating: bool) -> None:
        if self.started and not generating:
            QTimer.singleShot(300, self._next)

    def _shoot(self) -> None:
        if self.target == "memory":                  # wide enough that event lines are not cut
            self.window.resizeDocks([self.window.memory_dock], [560], Qt.Orientation.Horizontal)
            QApplication.processEvents()
        if self.target == "actions":                 # the hover actions, as on the mouse over the last reply
            bubble = self.window.chat.bubbles[-1]
            self.window.chat.ensureWidgetVisible(bubble)
            bubble.show_actions(True)
            QApplication.processEvents()
        widget = {"window": self.window, "memory": self.window.memory_dock, "actions": self.window}[self.target]
        if not widget.grab().save(self.path):
            self._fail(f"could not write {self.path}")
            return
        print(f"wrote {self.path}")
        QApplication.instance().exit(0)

    def _fail(self, message: str) -> None:
        if self.failed:
            return
        self.failed = message
        print(f"screenshot failed: {message}", file=sys.stderr)
        QApplication.instance().exit(1)


def settings_screenshot(window: MainWindow, path: str, tab: str = "Memory") -> None:
    dialog = window.open_settings()
    for i in range(dialog.tabs.count()):
        if dialog.tabs.tabText(i) == tab:
            dialog.tabs.setCurrentIndex(i)

    def shoot() -> None:
        ok = dialog.grab().save(path)
        print(f"wrote {path}" if ok else f"could not write {path}", file=sys.stdout if ok else sys.stderr)
        QApplication.instance().exit(0 if ok else 1)
    QTimer.singleShot(500, shoot)
