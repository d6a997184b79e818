"""Qt item models the widgets show: conversations, the memory blocks of one conversation, events.

Invariant: models only hold and order data the engine reported; they decide nothing. Block
states are the engine's strings (resident, ram, disk, dropped).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QAbstractListModel, QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QColor, QFont

_Index = QModelIndex | QPersistentModelIndex
STATES = ("resident", "ram", "disk", "dropped")
STATE_LABELS = {"resident": "resident", "ram": "in RAM", "disk": "on disk", "dropped": "dropped"}
EVENT_COLORS = {"evicted": "#d29922", "recovered": "#3fb950", "spilled": "#58a6ff", "dropped": "#8b949e",
                "kv_rebuilt": "#db61a2", "error": "#f85149", "kv_persisted": "#58a6ff",
                "kv_restored": "#3fb950",
                "blocks_reused": "#3fb950"}   # an event's text colour (ForegroundRole; others: the theme's text)
MEMORY_LABELS = {"slot": "slot", "ram": "RAM", "disk": "disk", "none": "cold"}

IdRole = Qt.ItemDataRole.UserRole + 1
MemoryRole = Qt.ItemDataRole.UserRole + 2
PinnedRole = Qt.ItemDataRole.UserRole + 3
UpdatedRole = Qt.ItemDataRole.UserRole + 4
StateRole = Qt.ItemDataRole.UserRole + 5
TokensRole = Qt.ItemDataRole.UserRole + 6
DepthRole = Qt.ItemDataRole.UserRole + 7     # 0 for a conversation, 1 for a fork of it, ...
SourceRole = Qt.ItemDataRole.UserRole + 8
GroupRole = Qt.ItemDataRole.UserRole + 9    # "" for the window's conversations, STATELESS_GROUP for one-shot API ones
GeneratingRole = Qt.ItemDataRole.UserRole + 10   # a reply is being written in it (the window's or an endpoint's)
STATELESS_GROUP = "One-shot API requests"


@dataclass
class ConversationRow:
    id: str
    title: str
    updated_at: float
    pinned: bool
    memory: str
    forked_from: str | None = None
    depth: int = 0
    source: str = "app"          # "api": made through the OpenAI-compatible endpoint
    stateless: bool = False      # made by API requests without a session: listed apart, deleted after its TTL

    @property
    def group(self) -> str:
        return STATELESS_GROUP if self.stateless else ""

    @classmethod
    def from_info(cls, info: Any) -> ConversationRow:
        updated = getattr(info, "updated_at", 0) or 0
        if not isinstance(updated, int | float):      # a datetime or an ISO string
            try:
                updated = updated.timestamp()
            except AttributeError:
                updated = 0.0
        parent = getattr(info, "forked_from", None)
        return cls(str(info.id), info.title or "Untitled", float(updated),
                   bool(getattr(info, "pinned", False)), str(getattr(info, "memory", "none")),
                   str(parent) if parent else None, source=str(getattr(info, "source", "app") or "app"),
                   stateless=bool(getattr(info, "stateless", False)))


def nest_forks(rows: list[ConversationRow]) -> list[ConversationRow]:
    """Each fork right under its parent (depth + 1), siblings in the given order; orphans at the top level."""
    ids = {r.id for r in rows}
    children: dict[str | None, list[ConversationRow]] = {}
    for row in rows:
        children.setdefault(row.forked_from if row.forked_from in ids else None, []).append(row)
    out: list[ConversationRow] = []

    def walk(parent: str | None, depth: int) -> None:
        for row in children.get(parent, []):
            if row.id in seen:                      # a cycle would be a corrupt history: show it once
                continue
            seen.add(row.id)
            row.depth = depth
            out.append(row)
            walk(row.id, depth + 1)
    seen: set[str] = set()
    walk(None, 0)
    out += [r for r in rows if r.id not in seen]
    return out


class ConversationListModel(QAbstractListModel):
    """Conversations, pinned first, then by last use (newest first); forks under their parent; the one-shot API
    conversations (stateless requests) after all the others, as their own group."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.rows: list[ConversationRow] = []
        self.generating: set[str] = set()          # conversations whose reply is being written now

    def set_generating(self, conversation_ids: set[str]) -> None:
        """Mark the conversations whose reply is being written; only rows that changed are repainted."""
        changed = self.generating ^ conversation_ids
        self.generating = set(conversation_ids)
        for conversation_id in changed:
            row = self.row_of(conversation_id)
            if row >= 0:
                index = self.index(row)
                self.dataChanged.emit(index, index, [GeneratingRole, Qt.ItemDataRole.ToolTipRole])

    def set_conversations(self, infos: list[Any]) -> None:
        rows = [ConversationRow.from_info(i) for i in infos]
        rows.sort(key=lambda r: (not r.pinned, -r.updated_at))
        rows = nest_forks(rows)
        rows = [r for r in rows if not r.stateless] + [r for r in rows if r.stateless]
        self.beginResetModel()
        self.rows = rows
        self.endResetModel()

    def show_new(self, conversation_id: str, title: str, when: float) -> None:
        """List a conversation just made at once, first after the pinned ones (where the next `set_conversations`
        puts it): the window does not wait for the engine to be asked for the whole list (it may be busy writing
        replies). Nothing when it is listed already."""
        if self.row_of(conversation_id) >= 0:
            return
        at = sum(1 for r in self.rows if r.pinned and not r.stateless)
        self.beginInsertRows(QModelIndex(), at, at)
        self.rows.insert(at, ConversationRow(conversation_id, title or "Untitled", when, False, "none"))
        self.endInsertRows()

    def row_of(self, conversation_id: str) -> int:
        return next((i for i, r in enumerate(self.rows) if r.id == conversation_id), -1)

    def rowCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008, N802
        return 0 if parent.isValid() else len(self.rows)

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        row = self.rows[index.row()]
        generating = row.id in self.generating
        return {
            Qt.ItemDataRole.DisplayRole: row.title,
            Qt.ItemDataRole.ToolTipRole: f"{row.title}\nmemory: {MEMORY_LABELS.get(row.memory, row.memory)}"
                                         + ("\nwriting a reply now" if generating else ""),
            GeneratingRole: generating,
            IdRole: row.id, MemoryRole: row.memory, PinnedRole: row.pinned, UpdatedRole: row.updated_at,
            DepthRole: row.depth,
            SourceRole: row.source,
            GroupRole: row.group,
        }.get(role)


@dataclass
class BlockRow:
    name: str
    role: str
    state: str
    tokens: int
    pinned: bool = False
    shared: bool = False
    recoveries: int = 0
    sibling_shared: bool = False
    attention: float | None = None      # share of the model's attention (1 = most attended); None: not captured
    reused_from: str | None = None      # "<conversation>:<block> (where, exact)": K/V spliced from another conversation
    file_name: str | None = None        # the attached file a file block is part of

    @property
    def shared_with(self) -> str:
        """'prefix' (the system/tools prefix), 'fork' (cells shared with a forked conversation), 'reused' (K/V
        spliced from another conversation) or ''."""
        return "prefix" if self.shared else "fork" if self.sibling_shared else "reused" if self.reused_from else ""


def _share(value: Any) -> float | None:
    return None if value is None else float(value)


class BlockTableModel(QAbstractTableModel):
    """The blocks of the open conversation in birth order: name, tokens, state, what it is shared with."""

    BASE_HEADERS = ("Block", "Tokens", "State", "Shared")
    ATTENTION_HEADER = "Attention"     # shown only while the engine captures the model's attention

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.rows: list[BlockRow] = []
        self.HEADERS: tuple[str, ...] = self.BASE_HEADERS

    def set_blocks(self, blocks: list[dict[str, Any]]) -> None:
        rows = [BlockRow(str(b.get("name", "?")), str(b.get("role", "")), str(b.get("state", "resident")),
                         int(b.get("tokens", 0)), bool(b.get("pinned")), bool(b.get("shared")),
                         int(b.get("recoveries", 0) or 0), bool(b.get("sibling_shared")),
                         _share(b.get("attention")), b.get("reused_from"), b.get("file_name")) for b in blocks]
        captured = any("attention" in b for b in blocks)
        self.beginResetModel()
        self.rows = rows
        self.HEADERS = self.BASE_HEADERS + ((self.ATTENTION_HEADER,) if captured else ())
        self.endResetModel()

    def set_state(self, name: str, state: str) -> bool:
        """An event moved one block; True when the block is known."""
        for i, row in enumerate(self.rows):
            if row.name == name:
                row.state = state
                self.dataChanged.emit(self.index(i, 0), self.index(i, len(self.HEADERS) - 1))
                return True
        return False

    def tokens_by_state(self) -> dict[str, int]:
        totals = dict.fromkeys(STATES, 0)
        for row in self.rows:
            totals[row.state] = totals.get(row.state, 0) + row.tokens
        return totals

    def rowCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008, N802
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008, N802
        return 0 if parent.isValid() else len(self.HEADERS)

    def headerData(self, section: int, orientation: Qt.Orientation,  # noqa: N802
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return self.HEADERS[section]
        return None

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        row = self.rows[index.row()]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            attention = "" if row.attention is None else f"{row.attention:.2f}"
            state = STATE_LABELS.get(row.state, row.state) + (" · kept" if row.pinned and not row.shared else "")
            return (row.name, str(row.tokens), state, row.shared_with, attention)[col]
        if role == Qt.ItemDataRole.FontRole and col == 0 and row.pinned and not row.shared:
            font = QFont()
            font.setBold(True)                         # a kept file's blocks stand out (and say "kept" in State)
            return font
        if role == Qt.ItemDataRole.TextAlignmentRole and col in (1, 4):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ToolTipRole:
            extra = [f"role {row.role}"] + (["shared prefix"] if row.shared else []) + \
                    (["shared with a fork"] if row.sibling_shared else []) + \
                    (["pinned"] if row.pinned else []) + \
                    ([f"recovered {row.recoveries}x"] if row.recoveries else []) + \
                    ([f"reused from {row.reused_from}"] if row.reused_from else [])
            state = STATE_LABELS.get(row.state, row.state)
            return f"{row.name}: {row.tokens} tokens, {state} ({', '.join(extra)})"
        if role == StateRole:
            return row.state
        if role == TokensRole:
            return row.tokens
        return None


@dataclass
class EventRow:
    time: float
    kind: str
    text: str
    extra: dict[str, Any] = field(default_factory=dict)


class EventLogModel(QAbstractListModel):
    """Newest-last list of memory events (evicted, recovered, ...), capped in length."""

    def __init__(self, limit: int = 500, parent=None) -> None:
        super().__init__(parent)
        self.limit = limit
        self.rows: list[EventRow] = []

    def append(self, kind: str, text: str, when: float | None = None) -> None:
        if len(self.rows) >= self.limit:
            self.beginRemoveRows(QModelIndex(), 0, 0)
            del self.rows[0]
            self.endRemoveRows()
        self.beginInsertRows(QModelIndex(), len(self.rows), len(self.rows))
        self.rows.append(EventRow(when or time.time(), kind, text))
        self.endInsertRows()

    def clear(self) -> None:
        self.set_rows([])

    def set_rows(self, rows: list[tuple[str, str, float]]) -> None:
        """Replace the list with (kind, text, time) rows, oldest first."""
        self.beginResetModel()
        self.rows = [EventRow(when, kind, text) for kind, text, when in rows[-self.limit:]]
        self.endResetModel()

    def texts(self) -> list[str]:
        return [r.text for r in self.rows]

    def rowCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008, N802
        return 0 if parent.isValid() else len(self.rows)

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        row = self.rows[index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.ToolTipRole):
            return f"{time.strftime('%H:%M:%S', time.localtime(row.time))}  {row.text}"
        if role == StateRole:
            return row.kind
        if role == Qt.ItemDataRole.ForegroundRole and row.kind in EVENT_COLORS:
            return QColor(EVENT_COLORS[row.kind])
        return None
