"""The "‹ 2/3 ›" switch of a message that has earlier versions (a regenerated reply, an edited message).

Invariants: stepping only shows text: an earlier version is read-only (the bubble's edit, regenerate, fork and
delete are off while it shows) and the bubble's live text (`bubble.source`) and footer come back at the last one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtWidgets import QHBoxLayout, QLabel, QToolButton, QWidget

if TYPE_CHECKING:
    from .chat_view import MessageBubble

EARLIER_NOTE = "Earlier version {n} of {total}: read-only (the newest is the one in the conversation)"


class VersionSwitch(QWidget):
    """Previous/next buttons and "n/total" in a bubble's header; hidden when there is one version."""

    def __init__(self, bubble: MessageBubble) -> None:
        super().__init__(bubble)
        self.setObjectName("versionSwitch")
        self.bubble = bubble
        self.texts: list[str] = []
        self.current = 0
        self._live_footer = ""
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 6, 0)
        row.setSpacing(0)
        self.previous = QToolButton(text="‹", objectName="versionStep", toolTip="Earlier version")
        self.label = QLabel(objectName="versionLabel")
        self.next = QToolButton(text="›", objectName="versionStep", toolTip="Later version")
        self.previous.clicked.connect(lambda: self.step(-1))
        self.next.clicked.connect(lambda: self.step(1))
        for widget in (self.previous, self.label, self.next):
            row.addWidget(widget)
        self.hide()

    @property
    def earlier(self) -> bool:
        """An earlier version shows now (the message's actions are off)."""
        return bool(self.texts) and self.current < len(self.texts) - 1

    def set_versions(self, texts: list[str]) -> None:
        """The message's versions, oldest first, the live one last; fewer than two hides the switch."""
        if self.earlier:
            self.show_version(len(self.texts) - 1)
        self.texts = list(texts) if len(texts) > 1 else []
        self.current = max(0, len(self.texts) - 1)
        self._update()
        self.setVisible(bool(self.texts))

    def step(self, delta: int) -> None:
        if self.texts:
            self.show_version(min(max(self.current + delta, 0), len(self.texts) - 1))

    def show_version(self, k: int) -> None:
        bubble, last = self.bubble, len(self.texts) - 1
        if k == self.current and self.texts:
            return
        if not self.earlier:
            self._live_footer = bubble.footer.text()
        self.current = k
        if k >= last:
            bubble.set_text(bubble.source, streaming=False)
            bubble.footer.setText(self._live_footer)
            bubble.footer.setVisible(bool(self._live_footer))
        else:
            bubble.set_text(self.texts[k], streaming=False)
            bubble.footer.setText(EARLIER_NOTE.format(n=k + 1, total=len(self.texts)))
            bubble.footer.setVisible(True)
        bubble.set_place(is_last=bubble.is_last, busy=bubble.busy)
        self._update()

    def _update(self) -> None:
        self.label.setText(f"{self.current + 1}/{len(self.texts)}" if self.texts else "")
        self.previous.setEnabled(self.current > 0)
        self.next.setEnabled(self.current < len(self.texts) - 1)
