"""A message's hover actions: a row of buttons, or one "⋯" menu of the same actions where the row does not fit.
Invariants: its minimum width is the "⋯" button's; the menu offers the buttons that apply, enabled as they are."""

from __future__ import annotations

from PySide6.QtCore import QSize, Signal
from PySide6.QtWidgets import QHBoxLayout, QMenu, QToolButton, QWidget

SPACING = 2


class MessageActions(QWidget):
    triggered = Signal(str)            # the action's name

    def __init__(self, actions: tuple[tuple[str, str, str], ...], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("messageActions")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(SPACING)
        row.addStretch(1)                      # the buttons, or "⋯", at the row's right end
        self.buttons: dict[str, QToolButton] = {}
        self.applies: dict[str, bool] = {}
        for name, text, tip in actions:
            button = QToolButton(text=text, toolTip=tip, objectName="messageAction")
            button.clicked.connect(lambda _=False, name=name: self.triggered.emit(name))
            self.buttons[name] = button
            self.applies[name] = True
            row.addWidget(button)
        self.more = QToolButton(text="⋯", toolTip="Actions on this message", objectName="messageAction")
        self.more.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.more.setStyleSheet("QToolButton::menu-indicator { image: none; width: 0px; }")   # "⋯" says it
        self.menu = QMenu(self.more)
        self.menu.aboutToShow.connect(self._fill_menu)
        self.more.setMenu(self.menu)
        self.more.hide()
        row.addWidget(self.more)
        self.compact = False

    def set_applies(self, name: str, applies: bool) -> None:
        """Whether action `name` applies to this message now (regenerate: only on the last reply)."""
        self.applies[name] = applies
        self._arrange()

    def set_label(self, name: str, text: str) -> None:
        """A button's text changes ("Copied ✓"): the row is refitted to its new width."""
        self.buttons[name].setText(text)
        self.updateGeometry()
        self._arrange()

    def full_width(self) -> int:
        """The row's width with every applying action as a button."""
        widths = [b.sizeHint().width() for n, b in self.buttons.items() if self.applies[n]]
        return sum(widths) + SPACING * max(len(widths) - 1, 0)

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(self.full_width(), super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        return QSize(self.more.sizeHint().width(), super().minimumSizeHint().height())

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._arrange()

    def _arrange(self) -> None:
        """Buttons where the row fits, else the "⋯" menu alone."""
        self.compact = self.width() < self.full_width()
        for name, button in self.buttons.items():
            button.setVisible(self.applies[name] and not self.compact)
        self.more.setVisible(self.compact)

    def _fill_menu(self) -> None:
        self.menu.clear()
        for name, button in self.buttons.items():
            if self.applies[name]:
                action = self.menu.addAction(button.text(), lambda name=name: self.triggered.emit(name))
                action.setToolTip(button.toolTip())
                action.setEnabled(button.isEnabled())
