"""The sidebar: search (titles filter the list; message hits show above it), New, and the conversation list
with a memory badge per row.

Invariant: the list shows `ConversationListModel` through a title filter; actions are emitted
as signals with the conversation id (the window confirms deletes and asks for titles).
"""

from __future__ import annotations

import time

from PySide6.QtCore import QModelIndex, QPoint, QRect, QRegularExpression, QSize, QSortFilterProxyModel, Qt, Signal
from PySide6.QtGui import QColor, QFont, QFontMetrics, QKeySequence, QPainter, QPen, QShortcut
from PySide6.QtWidgets import (
    QLineEdit,
    QListView,
    QMenu,
    QPushButton,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from ..item_models import (
    MEMORY_LABELS,
    DepthRole,
    GeneratingRole,
    GroupRole,
    IdRole,
    MemoryRole,
    PinnedRole,
    SourceRole,
    UpdatedRole,
)
from ..resources import icon
from ..theme import tone
from .search_box import MessageSearchResults

BADGE_COLORS = {"slot": "#3fb950", "ram": "#d29922", "disk": "#58a6ff", "none": "#6e7681"}
FORK_INDENT = 18


def relative_time(ts: float, now: float | None = None) -> str:
    if not ts:
        return ""
    delta = max(0.0, (now or time.time()) - ts)
    if delta < 60:
        return "just now"
    if delta < 3600:
        return f"{int(delta // 60)} min ago"
    if delta < 86400:
        return f"{int(delta // 3600)} h ago"
    return time.strftime("%d %b", time.localtime(ts))


WRITING = "✎ writing…   "          # the mark of a conversation whose reply is being written now


def badge_font(font: QFont) -> QFont:
    small = QFont(font)
    small.setPointSizeF(font.pointSizeF() * 0.8)
    return small


class ConversationDelegate(QStyledItemDelegate):
    """Title, time of last use, a pin mark and a coloured badge for where the memory is; forks indented. A row is
    as tall as its two lines in the list's font (the text size), 50 px at 10 pt."""

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex) -> QSize:  # noqa: N802
        # as wide as the list (a row never asks for width: the list narrows without a bar)
        return QSize(0, 2 * QFontMetrics(option.font).height() + 20)

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        depth = int(index.data(DepthRole) or 0)
        rect = option.rect.adjusted(6 + FORK_INDENT * depth, 3, -6, -3)
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        hover = bool(option.state & QStyle.StateFlag.State_MouseOver)
        if selected or hover:
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(QColor(tone("#2d3340" if selected else "#242a35",
                                         "#d8dee4" if selected else "#eaeef2")))
            painter.drawRoundedRect(rect, 6, 6)
        memory = index.data(MemoryRole) or "none"
        badge = MEMORY_LABELS.get(memory, memory)
        line_height = QFontMetrics(option.font).height()
        painter.setFont(badge_font(option.font))
        bw = painter.fontMetrics().horizontalAdvance(badge) + 14
        brect = QRect(rect.right() - bw - 6, rect.top() + 7, bw, painter.fontMetrics().height() + 4)
        color = QColor(BADGE_COLORS.get(memory, "#6e7681"))
        painter.setPen(QPen(color, 1))
        fill = QColor(color)
        fill.setAlpha(40)
        painter.setBrush(fill)
        painter.drawRoundedRect(brect, 8, 8)
        painter.drawText(brect, Qt.AlignmentFlag.AlignCenter, badge)
        painter.setPen(QColor(tone("#8b949e", "#57606a")))
        when = relative_time(index.data(UpdatedRole) or 0)
        pinned = bool(index.data(PinnedRole))
        api = index.data(SourceRole) == "api"
        group = index.data(GroupRole)           # one-shot API conversations: listed last, labelled by their group
        line = rect.adjusted(12, 11 + line_height, -8, 0)
        if index.data(GeneratingRole):          # a reply is being written in it: said first, in the accent colour
            painter.save()
            painter.setPen(QColor(tone("#58a6ff", "#0969da")))
            painter.drawText(line, Qt.AlignmentFlag.AlignLeft, WRITING)
            line = line.adjusted(painter.fontMetrics().horizontalAdvance(WRITING), 0, 0, 0)
            painter.restore()
        painter.drawText(line, Qt.AlignmentFlag.AlignLeft,
                         ("↳ fork   " if depth else "") + ("● pinned   " if pinned else "")
                         + (f"{group} · " if group else "API · " if api else "") + when)
        title_font = QFont(option.font)
        title_font.setBold(selected)
        painter.setFont(title_font)
        painter.setPen(QColor(tone("#e6edf3", "#1f2328")))
        title_rect = rect.adjusted(12, 5, -(bw + 16), 0)
        title = painter.fontMetrics().elidedText(index.data() or "", Qt.TextElideMode.ElideRight,
                                                 title_rect.width())
        painter.drawText(title_rect, Qt.AlignmentFlag.AlignLeft, title)
        painter.restore()


class ConversationSidebar(QWidget):
    newRequested = Signal()
    activated = Signal(str)
    renameRequested = Signal(str)
    deleteRequested = Signal(str)
    pinRequested = Signal(str, bool)
    exportRequested = Signal(str, str)          # conversation id, title

    def __init__(self, model, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("sidebar")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 10, 8, 8)
        layout.setSpacing(8)
        self.new_button = QPushButton("New conversation", objectName="newButton")
        self.new_button.setIcon(icon("new"))
        self.new_button.clicked.connect(self.newRequested)
        self.new_button.setFocusPolicy(Qt.FocusPolicy.NoFocus)     # typed spaces never press it (Ctrl+N does)
        layout.addWidget(self.new_button)
        self.search = QLineEdit(objectName="search", placeholderText="Search titles and messages (Ctrl+F)",
                                clearButtonEnabled=True)
        layout.addWidget(self.search)
        self.hits = MessageSearchResults()          # messages matching the search (SQLite FTS5), while it has text
        self.search.textChanged.connect(self.hits.set_query)
        layout.addWidget(self.hits, 1)
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(model)
        self.proxy.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        self.search.textChanged.connect(self._filter_titles)
        self.view = QListView(objectName="conversationList")
        self.view.setModel(self.proxy)
        self.view.setItemDelegate(ConversationDelegate(self.view))
        self.view.setMouseTracking(True)
        self.view.setUniformItemSizes(True)
        self.view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.view.customContextMenuRequested.connect(self._menu)
        self.view.clicked.connect(lambda index: self.activated.emit(index.data(IdRole)))
        self.view.doubleClicked.connect(lambda index: self.renameRequested.emit(index.data(IdRole)))
        for key, signal in ((Qt.Key.Key_F2, self.renameRequested), (Qt.Key.Key_Delete, self.deleteRequested)):
            shortcut = QShortcut(QKeySequence(key), self.view, context=Qt.ShortcutContext.WidgetShortcut)
            shortcut.activated.connect(lambda signal=signal: self._on_current(signal))
        layout.addWidget(self.view, 1)
        self._current = ""
        model.modelReset.connect(self._reselect)

    def _filter_titles(self, text: str) -> None:
        """Show the conversations whose title holds every word of `text`, in any order (as the search does)."""
        words = [QRegularExpression.escape(w) for w in text.split()]
        pattern = "".join(f"(?=.*{w})" for w in words)
        self.proxy.setFilterRegularExpression(QRegularExpression(
            pattern, QRegularExpression.PatternOption.CaseInsensitiveOption))

    def _on_current(self, signal) -> None:
        index = self.view.currentIndex()
        if index.isValid():
            signal.emit(index.data(IdRole))

    def visible_titles(self) -> list[str]:
        return [self.proxy.index(r, 0).data() for r in range(self.proxy.rowCount())]

    def visible_ids(self) -> list[str]:
        return [self.proxy.index(r, 0).data(IdRole) for r in range(self.proxy.rowCount())]

    def depth_of(self, conversation_id: str) -> int:
        """0 for a conversation, 1 for a fork shown under it, ...; -1 when not shown."""
        for r in range(self.proxy.rowCount()):
            index = self.proxy.index(r, 0)
            if index.data(IdRole) == conversation_id:
                return int(index.data(DepthRole) or 0)
        return -1

    def set_current(self, conversation_id: str) -> None:
        self._current = conversation_id
        self._reselect()

    def _reselect(self) -> None:
        for r in range(self.proxy.rowCount()):
            index = self.proxy.index(r, 0)
            if index.data(IdRole) == self._current:
                self.view.setCurrentIndex(index)
                return
        self.view.clearSelection()

    def _menu(self, point: QPoint) -> None:
        index = self.view.indexAt(point)
        if index.isValid():
            menu = self.menu_for(index)
            menu.exec(self.view.viewport().mapToGlobal(point))
            menu.deleteLater()

    def menu_for(self, index: QModelIndex) -> QMenu:
        """The context menu of the conversation at `index` (a list row)."""
        conversation_id, pinned, title = index.data(IdRole), bool(index.data(PinnedRole)), index.data() or ""
        menu = QMenu(self)
        menu.addAction("Open", lambda: self.activated.emit(conversation_id))
        menu.addAction("Rename…", lambda: self.renameRequested.emit(conversation_id))
        menu.addAction("Unpin" if pinned else "Pin",
                       lambda: self.pinRequested.emit(conversation_id, not pinned))
        menu.addAction("Export…", lambda: self.exportRequested.emit(conversation_id, title))
        menu.addSeparator()
        menu.addAction("Delete…", lambda: self.deleteRequested.emit(conversation_id))
        return menu
