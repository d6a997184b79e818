"""A line above the conversation that offers to undo the last delete ("Message deleted.  Undo  ×").

Invariant: it shows only while the controller says an undo is possible (`undoChanged`); Undo and × only emit.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QToolButton, QWidget


class UndoBar(QWidget):
    undoClicked = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("undoBar")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground)
        row = QHBoxLayout(self)
        row.setContentsMargins(14, 6, 8, 6)
        self.label = QLabel(objectName="undoText")
        self.undo_button = QPushButton("Undo", objectName="undoButton", toolTip="Bring the message back (Ctrl+Z)")
        self.undo_button.clicked.connect(self.undoClicked)
        close = QToolButton(text="×", objectName="bannerClose")
        close.clicked.connect(self.hide)
        row.addWidget(self.label, 1)
        row.addWidget(self.undo_button)
        row.addWidget(close)
        self.hide()

    def offer(self, text: str) -> None:
        """Show `text` with Undo; an empty text hides the bar."""
        self.label.setText(text)
        self.setVisible(bool(text))
