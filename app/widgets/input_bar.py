"""The message box: Enter sends, Shift+Enter breaks the line; attachments as chips; Send/Stop.

Invariant: the widget only emits what the user did (submitted, filesDropped, largePaste,
attachClicked, stopClicked); the window and the controller decide what follows.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QMimeData, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ..attachments import is_large_paste
from ..resources import icon


def _local_files(mime: QMimeData) -> list[str]:
    return [u.toLocalFile() for u in mime.urls() if u.isLocalFile()] if mime.hasUrls() else []


BOX_LINES = 3.6          # lines of text the message box shows: 84 px at 10.5 pt
BOX_CHROME_PX = 26       # its padding, border (resources/style.qss #prompt) and document margins, around the lines


class PromptEdit(QPlainTextEdit):
    """The message box; as tall as `BOX_LINES` lines in its font, so it grows and shrinks with the text size."""

    submitted = Signal()
    filesDropped = Signal(list)
    largePaste = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("prompt")
        self.setPlaceholderText("Message the model…   (Enter sends, Shift+Enter for a new line)")
        self.setTabChangesFocus(True)
        self.fit_height()

    def fit_height(self) -> None:
        self.setFixedHeight(BOX_CHROME_PX + round(BOX_LINES * self.fontMetrics().lineSpacing()))

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange:
            self.fit_height()

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            if event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
                self.insertPlainText("\n")
            else:
                self.submitted.emit()
            event.accept()
            return
        super().keyPressEvent(event)

    def insertFromMimeData(self, source: QMimeData) -> None:  # noqa: N802
        files = _local_files(source)
        if files:
            self.filesDropped.emit(files)
            return
        text = source.text()
        if text and is_large_paste(text):
            self.largePaste.emit(text)
            return
        super().insertFromMimeData(source)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:  # noqa: N802
        return bool(_local_files(source)) or super().canInsertFromMimeData(source)

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(400, 84)


class AttachmentChip(QWidget):
    removed = Signal()

    def __init__(self, name: str, chars: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chip")
        row = QHBoxLayout(self)
        row.setContentsMargins(8, 2, 2, 2)
        row.setSpacing(4)
        row.addWidget(QLabel(f"▣ {name}  ·  {chars:,} chars", objectName="chipLabel"))
        close = QToolButton(text="×", objectName="chipClose")
        close.setToolTip(f"Remove {name}")
        close.clicked.connect(self.removed)
        row.addWidget(close)


DRAFT_PAUSE_MS = 300         # typing paused this long: the draft is handed on as settled
DRAFT_EMBED_MS = 60          # paused this long (between two keystrokes, or before Enter): the draft's vector starts


class InputBar(QWidget):
    """Chips above a prompt box, with attach and send/stop buttons."""

    submitted = Signal(str)
    draftSettled = Signal(str)     # the text, once typing has paused (the engine prepares its turn ahead of Enter)
    draftTyped = Signal(str)       # the text, at each short pause (the engine starts its vector ahead of Enter)
    stopClicked = Signal()
    attachClicked = Signal()
    removeAttachment = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("inputBar")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(24, 8, 24, 14)
        outer.setSpacing(6)
        self.chip_row = QHBoxLayout()
        self.chip_row.setSpacing(6)
        self.chip_row.addStretch(1)
        outer.addLayout(self.chip_row)
        row = QHBoxLayout()
        row.setSpacing(8)
        self.attach_button = QToolButton(objectName="attachButton")
        self.attach_button.setIcon(icon("attach"))
        self.attach_button.setIconSize(QSize(20, 20))
        self.attach_button.setToolTip("Attach text files (they become file:<name>#i blocks)")
        self.attach_button.clicked.connect(self.attachClicked)
        self.prompt = PromptEdit(self)
        self.prompt.submitted.connect(self._submit)
        self._settle = QTimer(self, singleShot=True, interval=DRAFT_PAUSE_MS)
        self._settle.timeout.connect(lambda: self.draftSettled.emit(self.prompt.toPlainText()))
        self.prompt.textChanged.connect(self._settle.start)
        self._typed = QTimer(self, singleShot=True, interval=DRAFT_EMBED_MS)
        self._typed.timeout.connect(lambda: self.draftTyped.emit(self.prompt.toPlainText()))
        self.prompt.textChanged.connect(self._typed.start)
        self.send_button = QPushButton("Send", objectName="sendButton")
        self.send_button.setIcon(icon("send"))
        self.send_button.clicked.connect(self._submit)
        self.stop_button = QPushButton("Stop", objectName="stopButton")
        self.stop_button.setIcon(icon("stop"))
        self.stop_button.clicked.connect(self.stopClicked)
        self.stop_button.hide()
        row.addWidget(self.attach_button, 0, Qt.AlignmentFlag.AlignBottom)
        row.addWidget(self.prompt, 1)
        row.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        row.addWidget(self.stop_button, 0, Qt.AlignmentFlag.AlignBottom)
        outer.addLayout(row)
        self.chips: list[AttachmentChip] = []
        self._can_send = True

    def _submit(self) -> None:
        if self._can_send:
            self.submitted.emit(self.prompt.toPlainText())

    def clear(self) -> None:
        self.prompt.clear()

    def set_generating(self, generating: bool) -> None:
        self.send_button.setVisible(not generating)
        self.stop_button.setVisible(generating)
        self._can_send = not generating

    def set_ready(self, ready: bool) -> None:
        self.send_button.setEnabled(ready)

    def set_attachments(self, attachments: list[tuple[str, int]]) -> None:
        for chip in self.chips:
            chip.setParent(None)
            chip.deleteLater()
        self.chips = []
        for i, (name, chars) in enumerate(attachments):
            chip = AttachmentChip(name, chars, self)
            chip.removed.connect(lambda i=i: self.removeAttachment.emit(i))
            self.chip_row.insertWidget(i, chip)
            self.chips.append(chip)
