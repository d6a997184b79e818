"""The "‹ 2/3 ›" switch of a message that has other versions (a regenerated reply, an edited message).

Invariants: the switch shows the message's current version (the one in the conversation) among its versions; a
step asks for another version to become current (`chosen` with its history row id: the controller switches the
whole branch below it and the view is rebuilt from the history), and until the answer comes the switch is
`switching` (its steps and the bubble's edit actions off).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QToolButton, QWidget

from ..messages import Versions

if TYPE_CHECKING:
    from .chat_view import MessageBubble


class VersionSwitch(QWidget):
    """Previous/next buttons and "n/total" in a bubble's header; hidden when there is one version."""

    chosen = Signal(int)          # the history row id of the version to make current

    def __init__(self, bubble: MessageBubble) -> None:
        super().__init__(bubble)
        self.setObjectName("versionSwitch")
        self.bubble = bubble
        self.versions: Versions | None = None
        self.switching = False
        self.busy = False                 # a reply streams: no steps
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 6, 0)
        row.setSpacing(0)
        self.previous = QToolButton(text="‹", objectName="versionStep", toolTip="Earlier version (it becomes current)")
        self.label = QLabel(objectName="versionLabel")
        self.next = QToolButton(text="›", objectName="versionStep", toolTip="Later version (it becomes current)")
        self.previous.clicked.connect(lambda: self.step(-1))
        self.next.clicked.connect(lambda: self.step(1))
        for widget in (self.previous, self.label, self.next):
            row.addWidget(widget)
        self.hide()

    @property
    def current(self) -> int:
        return self.versions.current if self.versions else 0

    def set_versions(self, versions: Versions | None) -> None:
        """The message's versions (None or one version hides the switch); a pending switch is over."""
        self.versions = versions if versions is not None and len(versions.ids) > 1 else None
        self.switching = False
        self._update()
        self.setVisible(self.versions is not None)

    def step(self, delta: int) -> None:
        """Ask for the version `delta` steps away to become current (nothing while a switch is pending)."""
        if self.versions is None or self.switching:
            return
        target = self.versions.current + delta
        if 0 <= target < len(self.versions.ids):
            self.switching = True
            self.bubble.set_place(is_last=self.bubble.is_last, busy=self.bubble.busy)   # its actions off too
            self.chosen.emit(self.versions.ids[target])

    def set_busy(self, busy: bool) -> None:
        """Steps off while the conversation is busy (a reply streams)."""
        self.busy = busy
        self._update()

    def _update(self) -> None:
        versions, free = self.versions, not self.switching and not self.busy
        self.label.setText(f"{versions.current + 1}/{len(versions.ids)}" if versions else "")
        self.previous.setEnabled(bool(versions) and free and versions.current > 0)
        self.next.setEnabled(bool(versions) and free and versions.current < len(versions.ids) - 1)
