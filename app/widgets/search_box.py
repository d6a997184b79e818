"""The hits of the sidebar's search: one row per conversation whose title matches, then one per live message that
matches, under the search field.

Invariants: no logic but display; a query is asked for (`searchRequested`) once typing pauses, hits arrive
through `set_hits` and are shown only for the query on screen; choosing a hit (click or Enter) emits
`hitChosen(conversation id, message row id)`; hidden while the field is empty.
"""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtWidgets import QLabel, QListWidget, QListWidgetItem, QVBoxLayout, QWidget

from evoke_engine import MARK_END, MARK_START

from ..messages import stamp_text

TYPING_PAUSE_MS = 180
HitRole = Qt.ItemDataRole.UserRole + 40


def hit_html(hit: Any) -> str:
    """A hit as rich text: the conversation's title and the time, then the snippet with its matches in bold."""
    snippet = html.escape(str(hit.snippet)).replace(MARK_START, "<b style='color:#e3b341;'>").replace(
        MARK_END, "</b>")
    if getattr(hit, "is_title", False):
        return (f"<div style='color:#8b949e; font-size:8.5pt;'>Conversation title · "
                f"{html.escape(stamp_text(hit.created_at))}</div><div>{snippet}</div>")
    who = "You" if hit.role == "user" else "Assistant" if hit.role == "assistant" else html.escape(hit.role)
    return (f"<div style='color:#8b949e; font-size:8.5pt;'>{html.escape(hit.title or 'Untitled')} · {who} · "
            f"{html.escape(stamp_text(hit.created_at))}</div><div>{snippet}</div>")


def summary_text(hits: list[Any]) -> str:
    """What the hits hold, in words: '2 titles and 1 message match', 'No title or message matches'."""
    titles = sum(1 for hit in hits if getattr(hit, "is_title", False))
    messages = len(hits) - titles
    if not hits:
        return "No title or message matches"
    parts = [f"{n} {word}{'' if n == 1 else 's'}" for n, word in ((titles, "title"), (messages, "message")) if n]
    return " and ".join(parts) + (" matches" if len(hits) == 1 else " match")


class HitList(QListWidget):
    """The hits; each row's height follows the list's width (the snippets wrap)."""

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self.fit_rows()

    def fit_rows(self) -> None:
        width = max(self.viewport().width() - 4, 120)
        for row in range(self.count()):
            item = self.item(row)
            label = self.itemWidget(item)
            if label is not None:
                item.setSizeHint(QSize(width, label.heightForWidth(width) + 2))


class MessageSearchResults(QWidget):
    searchRequested = Signal(str)
    hitChosen = Signal(str, int)              # conversation id, message row id

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("messageSearch")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        self.summary = QLabel(objectName="searchSummary")
        self.summary.setWordWrap(True)
        layout.addWidget(self.summary)
        self.list = HitList(objectName="searchHits")
        self.list.setWordWrap(True)
        self.list.setToolTip("Click a title to open its conversation, a message to open its conversation there")
        self.list.setVerticalScrollMode(QListWidget.ScrollMode.ScrollPerPixel)
        self.list.itemClicked.connect(self._chosen)
        self.list.itemActivated.connect(self._chosen)
        layout.addWidget(self.list, 1)
        self.query = ""
        self.hits: list[Any] = []
        self._pause = QTimer(self, singleShot=True, interval=TYPING_PAUSE_MS,
                             timeout=lambda: self.searchRequested.emit(self.query))
        self.hide()

    def set_query(self, text: str) -> None:
        """The search field changed: ask for hits once typing pauses (none, and hidden, for an empty field)."""
        self.query = text
        if not text.strip():
            self._pause.stop()
            self.set_hits(text, [])
            self.hide()
            self.searchRequested.emit(text)
            return
        self.summary.setText("Searching titles and messages…")
        self.show()
        self._pause.start()

    def set_hits(self, query: str, hits: list[Any]) -> None:
        if query != self.query:
            return
        self.hits = list(hits)
        self.list.clear()
        for hit in self.hits:
            item = QListWidgetItem()
            item.setData(HitRole, (hit.conversation_id, hit.message_id))
            label = QLabel(hit_html(hit), objectName="searchHit")
            label.setWordWrap(True)
            label.setTextFormat(Qt.TextFormat.RichText)
            label.setContentsMargins(6, 4, 6, 4)
            label.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
            item.setToolTip(f"{hit.title}\n{hit.plain_snippet}" if hasattr(hit, "plain_snippet") else hit.title)
            self.list.addItem(item)
            self.list.setItemWidget(item, label)
        self.list.fit_rows()
        if query.strip():
            self.summary.setText(summary_text(self.hits))

    def choose(self, row: int) -> None:
        item = self.list.item(row)
        if item is not None:
            self._chosen(item)

    def _chosen(self, item: QListWidgetItem) -> None:
        conversation_id, message_id = item.data(HitRole)
        self.hitChosen.emit(str(conversation_id), int(message_id))
