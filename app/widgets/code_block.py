"""One fenced code block in a message: a header with its language and a Copy button, and the code
highlighted, never wrapped, scrolling sideways when a line is wider than the view.

Invariants: the Copy button stays in the header whatever the width of the code (it is not part of
the scrolling text); copying changes only the button's text, nothing else in the message; the block
is as tall as its code plus the horizontal scroll bar when one shows.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QWheelEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QTextBrowser, QToolButton, QVBoxLayout, QWidget

from ..render import CODE_BG, CODE_HEADER_BG


def pass_zoom_wheel(event: QWheelEvent) -> bool:
    """Ctrl+wheel over a part of a message goes on to the chat (one text size for all, not this part's own
    zoom): True when it was passed on."""
    if event.modifiers() & Qt.KeyboardModifier.ControlModifier:
        event.ignore()
        return True
    return False


class CodeText(QTextBrowser):
    """The code itself: no wrapping, a horizontal scroll bar as needed, as tall as its lines."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("codeText")
        self.setOpenLinks(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setLineWrapMode(QTextBrowser.LineWrapMode.NoWrap)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setStyleSheet(f"QTextBrowser#codeText {{ background-color: {CODE_BG}; }}")
        self.document().setDocumentMargin(8)
        self.document().documentLayout().documentSizeChanged.connect(self.fit)
        self.horizontalScrollBar().rangeChanged.connect(self.fit)

    def fit(self, *_: object) -> None:
        bar = self.horizontalScrollBar()
        extra = bar.sizeHint().height() if bar.maximum() > 0 else 0
        height = int(self.document().size().height()) + extra + 2
        if self.height() != height:
            self.setFixedHeight(height)

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self.fit()

    def wheelEvent(self, event: QWheelEvent) -> None:  # noqa: N802
        if not pass_zoom_wheel(event):
            super().wheelEvent(event)


class CodeBlockView(QFrame):
    """A header (language, Copy) above the code."""

    copied = Signal(str)

    def __init__(self, index: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("codeBlock")
        self.index = index
        self.code = ""
        self._shown: tuple[str, str] | None = None
        col = QVBoxLayout(self)
        col.setContentsMargins(0, 4, 0, 4)
        col.setSpacing(0)
        header = QWidget(objectName="codeHeader")
        header.setAttribute(Qt.WidgetAttribute.WA_StyledBackground)
        header.setStyleSheet(f"QWidget#codeHeader {{ background-color: {CODE_HEADER_BG}; }}")
        row = QHBoxLayout(header)
        row.setContentsMargins(8, 2, 4, 2)
        self.language = QLabel(objectName="codeLanguage")
        self.language.setStyleSheet("color: #8b93a5;")
        self.copy_button = QToolButton(text="Copy", objectName="codeCopy")
        self.copy_button.setToolTip("Copy this code block")
        self.copy_button.setStyleSheet("color: #7aa2f7;")
        self.copy_button.clicked.connect(self.copy)
        row.addWidget(self.language, 1)
        row.addWidget(self.copy_button)
        self.text = CodeText(self)
        col.addWidget(header)
        col.addWidget(self.text)
        self._reset = QTimer(self, singleShot=True, interval=2000, timeout=lambda: self.copy_button.setText("Copy"))

    def set_code(self, code: str, lang: str, html: str) -> None:
        self.code = code
        self.language.setText(lang or "code")
        if self._shown != (code, lang):
            self._shown = (code, lang)
            bar = self.text.horizontalScrollBar()
            keep = bar.value()
            self.text.setHtml(html)
            bar.setValue(keep)

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.code)
        self.copy_button.setText("Copied ✓")
        self._reset.start()
        self.copied.emit(self.code)
