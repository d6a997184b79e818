"""A one-line label that gives way: narrower than its text, it paints the text cut with "…", the whole in its tooltip.
Invariants: `text()` is always the whole text; its minimum width is a few characters, never the text's."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QLabel, QWidget

MIN_CHARS = "Mm…"          # the narrowest an elided label goes: a letter or two and the ellipsis


class ElidedLabel(QLabel):
    def __init__(self, text: str = "", parent: QWidget | None = None, **kwargs: object) -> None:
        super().__init__(text, parent, **kwargs)
        self._own_tip = ""                   # a tooltip the caller set (shown whole, with the text when it is cut)
        self._tip_shown = ""

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        hint = super().minimumSizeHint()
        margins = self.contentsMargins()
        least = self.fontMetrics().horizontalAdvance(MIN_CHARS) + margins.left() + margins.right()
        return QSize(min(hint.width(), least), hint.height())

    def setText(self, text: str) -> None:  # noqa: N802
        super().setText(text)
        self._update_tip()

    def setToolTip(self, tip: str) -> None:  # noqa: N802
        self._own_tip = tip
        self._update_tip()

    def elided(self) -> bool:
        return self.fontMetrics().horizontalAdvance(self.text()) > self.contentsRect().width()

    def _update_tip(self) -> None:
        tip = "\n".join(t for t in (self.text() if self.elided() else "", self._own_tip) if t)
        if tip != self._tip_shown:
            self._tip_shown = tip
            super().setToolTip(tip)

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._update_tip()

    def paintEvent(self, event) -> None:  # noqa: N802
        if not self.elided():
            super().paintEvent(event)
            return
        painter = QPainter(self)
        self.drawFrame(painter)
        rect = self.contentsRect()
        text = self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, rect.width())
        self.style().drawItemText(painter, rect, int(self.alignment()), self.palette(), self.isEnabled(), text,
                                  self.foregroundRole())
