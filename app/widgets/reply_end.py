"""The end of a reply that stopped short: a mark saying why (stopped, cut at max tokens, interrupted) and, on the
conversation's last reply, a "Continue generating" button.

Invariants: hidden for a finished reply (no note); a stop or a cut shows on the reply that can go on (the last
message, nothing streaming: elsewhere its footer says it), an interruption on every reply it cut; the button shows
only where continuing applies and only emits `continueClicked`: the controller decides.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QToolButton, QWidget

from ..messages import CONTINUE_LABEL


class ReplyEnd(QWidget):
    """"Cut at max tokens   [Continue generating]" under a reply that ended short."""

    continueClicked = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("replyEnd")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 2, 0, 0)
        row.setSpacing(8)
        self.note = QLabel(objectName="replyEndNote")
        font = self.note.font()
        font.setItalic(True)
        self.note.setFont(font)
        self.note.setWordWrap(True)                  # a narrow bubble wraps the note beside the button
        self.always = False
        self.can_continue = False
        self.button = QToolButton(text=CONTINUE_LABEL, objectName="continueButton",
                                  toolTip="Go on writing this reply from where it stopped")
        self.button.clicked.connect(self.continueClicked.emit)
        row.addWidget(self.note, 1)
        row.addWidget(self.button)
        self.button.hide()
        self.hide()

    def set_note(self, note: str, *, always: bool = False) -> None:
        """Why the reply ended short ("" for a finished one); `always`: shown even where it cannot go on."""
        self.note.setText(note)
        self.always = always
        self._update()

    def offer(self, can_continue: bool) -> None:
        """Whether this reply can go on now (the last message, nothing streaming)."""
        self.can_continue = can_continue
        self._update()

    def _update(self) -> None:
        noted = bool(self.note.text())
        self.button.setVisible(noted and self.can_continue)
        self.setVisible(noted and (self.always or self.can_continue))
