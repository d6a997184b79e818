"""The chat's room beside the side panels: as the window narrows, the memory dock, then the sidebar, give way so the
chat keeps `CHAT_COMFORT_WIDTH`; as it widens they grow back to the widths the user chose (`wanted`).

Invariants: a panel is never set below its minimum nor above its wanted width (one dragged shut stays shut); with both
at their minimums the window's minimum width is under 800 px."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QEvent, QObject, Qt, QTimer

if TYPE_CHECKING:
    from .window import MainWindow

CHAT_MIN_WIDTH = 300          # the conversation column (chat, message box) at its narrowest
CHAT_COMFORT_WIDTH = 520      # what the panels give way to, while they can
SIDEBAR_MIN_WIDTH = 180
MEMORY_MIN_WIDTH = 250
PANELS = ("memory", "sidebar")     # in the order they give way
SLACK = 8                           # px a panel may differ from where it was placed and still be ours, not the user's


class PanelRoom(QObject):
    """Watches the window's resizes and places the panels, once the layout has the new size."""

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.window = window
        self.wanted: dict[str, int] = {}        # each panel's width when the chat has room: the user's choice
        self.placed: dict[str, int] = {}        # the width it was last given here
        self._settle = QTimer(self, singleShot=True, interval=0, timeout=self.settle)
        window.installEventFilter(self)
        window.memory_dock.visibilityChanged.connect(lambda _shown: self._settle.start())

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802
        if watched is self.window and event.type() == QEvent.Type.Resize:
            if not self._settle.isActive():       # before the layout moves anything: what the user chose
                self._note_choices()
            self._settle.start()
        return False

    def widths(self) -> dict[str, int]:
        """The open panels' widths now (a floating dock, or one above or below the chat, is not beside it)."""
        window, dock, split = self.window, self.window.memory_dock, self.window.centralWidget()
        widths = {}
        if dock.isVisible() and not dock.isFloating() and window.dockWidgetArea(dock) in (
                Qt.DockWidgetArea.LeftDockWidgetArea, Qt.DockWidgetArea.RightDockWidgetArea):
            widths["memory"] = dock.width()
        if window.sidebar.isVisible() and len(split.sizes()) == 2:
            widths["sidebar"] = split.sizes()[0]
        return widths

    def _note_choices(self) -> None:
        for name, width in self.widths().items():
            if name not in self.placed or abs(width - self.placed[name]) > SLACK:
                self.wanted[name] = width

    def settle(self) -> None:
        """Each open panel at its wanted width less its share of what the chat lacks, the memory dock first."""
        widths = self.widths()
        for name, width in widths.items():
            self.wanted.setdefault(name, width)
        room = self.window.centre.width() + sum(widths.values())
        short = CHAT_COMFORT_WIDTH - (room - sum(self.wanted[name] for name in widths))
        least = {"memory": self.window.memory_dock.minimumWidth(), "sidebar": self.window.sidebar.minimumWidth()}
        for name in (n for n in PANELS if n in widths):
            want = self.wanted[name]
            target = want if want <= least[name] else max(least[name], want - max(short, 0))
            short -= want - target
            self.placed[name] = target
            if target != widths[name]:
                self._place(name, target)

    def _place(self, name: str, width: int) -> None:
        if name == "memory":
            self.window.resizeDocks([self.window.memory_dock], [width], Qt.Orientation.Horizontal)
        else:
            split = self.window.centralWidget()
            sizes = split.sizes()
            split.setSizes([width, sum(sizes) - width])
