"""The memory dock's content: counters, a block strip, the block table and the event list.

Invariant: shows `BlockTableModel` and `EventLogModel` and the last stats dict (with the last turn's
breakdown of its first token); colours come
from STATE_COLORS so the strip, the table and the legend agree; shared blocks (the prefix, or
cells shared with a fork) are darker in the strip and named in the table's Shared column. A long chat's
hundreds of blocks and events cost the GUI thread a bounded amount per stats refresh: event rows take their
colour from the model (no Python delegate per row), are laid out in batches, and sized columns sample rows. A file
block's context menu asks to keep its file in context, or to let it go (`keepFileAsked`); the panel decides nothing.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QModelIndex, QPoint, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import (
    QAbstractItemView,
    QGridLayout,
    QHeaderView,
    QLabel,
    QListView,
    QMenu,
    QSplitter,
    QStyledItemDelegate,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from ..item_models import STATE_LABELS, STATES, StateRole

STATE_COLORS = {"resident": "#3fb950", "ram": "#d29922", "disk": "#58a6ff", "dropped": "#6e7681"}
CONTENTS_PRECISION_ROWS = 64    # rows a ResizeToContents column measures (Qt's default, 1000, is every row here)
BLOCK_NAME_MIN_WIDTH = 64      # the block table's narrowest column (the names' Stretch column gives way to this)
EVENT_LAYOUT_BATCH = 40         # wrapped event rows laid out per event-loop pass


class BlockStrip(QWidget):
    """Every block in order as a segment whose width follows its tokens, coloured by state."""

    def __init__(self, model, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self.setMinimumHeight(26)
        for sig in (model.modelReset, model.dataChanged):
            sig.connect(self._changed)

    def _changed(self, *_: object) -> None:
        self.update()

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(280, 26)

    def paintEvent(self, _event) -> None:  # noqa: N802
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = QRectF(self.rect()).adjusted(1, 3, -1, -3)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(QColor("#161b22"))
        painter.drawRoundedRect(rect, 4, 4)
        rows = self.model.rows
        total = sum(max(r.tokens, 1) for r in rows)
        if not total:
            return
        x = rect.left()
        for row in rows:
            width = rect.width() * max(row.tokens, 1) / total
            color = QColor(STATE_COLORS.get(row.state, "#6e7681"))
            if row.shared or row.sibling_shared:         # shared cells: darker, as in the table's Shared column
                color = color.darker(140)
            painter.setBrush(color)
            painter.drawRect(QRectF(x, rect.top(), max(width - 1, 1), rect.height()))
            x += width


class StateDelegate(QStyledItemDelegate):
    """Draws the state column as a coloured pill holding the model's text (the state, and "· kept" on a block of a
    file kept in context)."""

    PADDING = 20              # the pill's inset and rounded ends around its text
    MIN_WIDTH = 92            # every pill at least this wide, kept or not

    @staticmethod
    def pill_text(index: QModelIndex) -> str:
        state = index.data(StateRole) or "resident"
        return str(index.data(Qt.ItemDataRole.DisplayRole) or STATE_LABELS.get(state, state))

    def sizeHint(self, option, index: QModelIndex) -> QSize:  # noqa: N802
        hint = super().sizeHint(option, index)
        width = option.fontMetrics.horizontalAdvance(self.pill_text(index)) + self.PADDING
        return QSize(max(width, self.MIN_WIDTH), hint.height())

    def paint(self, painter: QPainter, option, index: QModelIndex) -> None:
        state = index.data(StateRole) or "resident"
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        color = QColor(STATE_COLORS.get(state, "#6e7681"))
        r = QRectF(option.rect).adjusted(4, 4, -4, -4)
        fill = QColor(color)
        fill.setAlpha(45)
        painter.setPen(QPen(color, 1))
        painter.setBrush(fill)
        painter.drawRoundedRect(r, r.height() / 2, r.height() / 2)
        painter.drawText(r, Qt.AlignmentFlag.AlignCenter, self.pill_text(index))
        painter.restore()


def _counter(title: str) -> tuple[QLabel, QWidget]:
    box = QWidget(objectName="counter")
    layout = QVBoxLayout(box)
    layout.setContentsMargins(8, 4, 8, 4)
    layout.setSpacing(0)
    value = QLabel("0", objectName="counterValue")
    layout.addWidget(value)
    layout.addWidget(QLabel(title, objectName="counterTitle"))
    return value, box


def breakdown_text(breakdown: dict[str, Any]) -> str:
    """The last turn's time to its first token by phase, largest first, in ms (`conversations.breakdown`)."""
    first = breakdown.get("first_token") or breakdown
    if not first.get("total_s"):
        return ""
    phases = sorted(((key[:-2].replace("_", " "), float(value)) for key, value in first.items()
                     if key.endswith("_s") and key not in ("total_s", "outside_llama_s") and float(value) >= 0.0005),
                    key=lambda kv: -kv[1])
    shown = " · ".join(f"{name} {value * 1000:.0f}" for name, value in phases)
    return f"Last first token {float(first['total_s']) * 1000:.0f} ms: {shown or 'nothing measurable'} (ms)"


class MemoryPanel(QWidget):
    keepFileAsked = Signal(str, bool)      # (file name, keep): keep an attached file in context, or let it go

    def __init__(self, blocks_model, events_model, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("memoryPanel")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 8, 10, 8)
        layout.setSpacing(8)
        self.summary = QLabel("No conversation open", objectName="memorySummary")
        self.summary.setWordWrap(True)
        layout.addWidget(self.summary)
        self.writing = QLabel("", objectName="memoryWriting", visible=False)   # replies being written, any window
        self.writing.setWordWrap(True)
        layout.addWidget(self.writing)
        self.breakdown = QLabel("", objectName="turnBreakdown")     # the last turn's first token, by phase
        self.breakdown.setWordWrap(True)
        layout.addWidget(self.breakdown)
        grid = QGridLayout()
        grid.setSpacing(6)
        self.counters: dict[str, QLabel] = {}
        for i, (key, title) in enumerate((("active", "active tokens"), ("cached", "saved tokens"),
                                          ("evictions", "evictions"), ("recoveries", "recoveries"))):
            value, box = _counter(title)
            self.counters[key] = value
            grid.addWidget(box, i // 2, i % 2)
        layout.addLayout(grid)
        self.strip = BlockStrip(blocks_model)
        layout.addWidget(self.strip)
        self.legend = QLabel(objectName="legend")             # one line, wrapped where the dock is narrow
        self.legend.setWordWrap(True)
        layout.addWidget(self.legend)
        split = QSplitter(Qt.Orientation.Vertical)
        self.table = QTableView(objectName="blockTable")
        self.table.setModel(blocks_model)
        self.table.setItemDelegateForColumn(2, StateDelegate(self.table))
        self.table.verticalHeader().hide()
        self.table.setShowGrid(False)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setDefaultSectionSize(24)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)   # "resident · kept" fits
        header.setSectionResizeMode(3, QHeaderView.ResizeMode.ResizeToContents)
        header.setResizeContentsPrecision(CONTENTS_PRECISION_ROWS)    # not every row at every stats refresh
        header.setMinimumSectionSize(BLOCK_NAME_MIN_WIDTH)     # a narrow dock scrolls the table, names stay legible
        blocks_model.modelReset.connect(self._fit_attention_column)
        self.table.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.table.customContextMenuRequested.connect(self._block_menu)
        split.addWidget(self.table)
        events_box = QWidget()
        events_layout = QVBoxLayout(events_box)
        events_layout.setContentsMargins(0, 4, 0, 0)
        events_layout.addWidget(QLabel("Events", objectName="sectionTitle"))
        self.events = QListView(objectName="eventList")
        self.events.setModel(events_model)
        self.events.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.events.setWordWrap(True)                           # a long event wraps, never cut
        self.events.setTextElideMode(Qt.TextElideMode.ElideNone)
        self.events.setUniformItemSizes(False)
        self.events.setResizeMode(QListView.ResizeMode.Adjust)
        self.events.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.events.setLayoutMode(QListView.LayoutMode.Batched)     # hundreds of wrapped rows: laid out in steps
        self.events.setBatchSize(EVENT_LAYOUT_BATCH)
        events_layout.addWidget(self.events)
        split.addWidget(events_box)
        split.setSizes([320, 200])
        layout.addWidget(split, 1)
        self.blocks_model = blocks_model
        events_model.rowsInserted.connect(lambda *_: self.events.scrollToBottom())
        for sig in (blocks_model.modelReset, blocks_model.dataChanged):
            sig.connect(self._update_legend)
        self._update_legend()

    def _update_legend(self, *_: Any) -> None:
        totals = self.blocks_model.tokens_by_state()
        self.legend.setText(" &nbsp; ".join(f"<span style='color:{STATE_COLORS[state]}'>■</span>&nbsp;"
                                            f"{STATE_LABELS[state].replace(' ', '&nbsp;')}&nbsp;{totals.get(state, 0)}"
                                            for state in STATES))

    def set_writing(self, names: list[str]) -> None:
        """The conversations whose reply the model is writing now (this window's and the endpoint's)."""
        self.writing.setText("✎ Writing now: " + ", ".join(f"“{name}”" for name in names) if names else "")
        self.writing.setVisible(bool(names))

    def set_stats(self, stats: dict[str, Any]) -> None:
        active, budget = int(stats.get("active_tokens", 0)), int(stats.get("budget_tokens", 0))
        self.counters["active"].setText(f"{active} / {budget}")
        self.counters["cached"].setText(str(stats.get("cached_tokens", 0)))
        self.counters["evictions"].setText(str(stats.get("evictions", 0)))
        self.counters["recoveries"].setText(str(stats.get("recoveries", 0)))
        self.summary.setText(f"Turn {stats.get('turn', 0)} · prefix {stats.get('prefix_tokens', 0)} tokens "
                             f"(shared) · recovery: {stats.get('recovery', '?')} · "
                             f"memory: {stats.get('memory', '?')}")
        self.breakdown.setText(breakdown_text(stats.get("turn_breakdown") or {}))

    def file_actions(self, row_index: int) -> list[tuple[str, bool]]:
        """What a block row's menu offers: (label, keep) for a file's block, nothing for others."""
        if not 0 <= row_index < len(self.blocks_model.rows):
            return []
        row = self.blocks_model.rows[row_index]
        if not row.file_name:
            return []
        if row.pinned:
            return [(f"Let {row.file_name} leave the context", False)]
        return [(f"Keep {row.file_name} in context", True)]

    def _block_menu(self, point: QPoint) -> None:
        index = self.table.indexAt(point)
        actions = self.file_actions(index.row()) if index.isValid() else []
        if not actions:
            return
        row = self.blocks_model.rows[index.row()]
        menu = QMenu(self)
        for label, keep in actions:
            menu.addAction(label, lambda keep=keep: self.keepFileAsked.emit(row.file_name, keep))
        menu.exec(self.table.viewport().mapToGlobal(point))

    def counts(self) -> dict[str, str]:
        return {k: v.text() for k, v in self.counters.items()}

    def _fit_attention_column(self) -> None:
        """The Attention column comes and goes with the capture; size it to its figures when present."""
        if self.table.model().columnCount() > 4:
            self.table.horizontalHeader().setSectionResizeMode(4, QHeaderView.ResizeMode.ResizeToContents)

    def block_rows(self) -> list[tuple[str, int, str]]:
        return [(r.name, r.tokens, r.state) for r in self.blocks_model.rows]
