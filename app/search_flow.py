"""Searching the chat history from the window, and opening a hit at its message.

Invariants: searches run through the bridge (never on the GUI thread): the engine's `search` (SQLite FTS5)
when an engine exists, else the read-only history reader; only the latest query's hits are emitted
(`searchResults`); opening a hit reveals its message (`messageRevealed` with its position in `messages`)
once that conversation's messages are on screen, and at most once.
"""

from __future__ import annotations

import logging
from typing import Any

from .bridge import error_text

log = logging.getLogger(__name__)
SEARCH_LIMIT = 50


class SearchFlow:
    """Mixed into ChatController (uses its bridge, engine, settings, messages and the search signals)."""

    _search_query = ""
    _reveal: tuple[str, int] | None = None      # (conversation id, message row id) of the hit being opened

    def search(self, query: str) -> None:
        """Find live messages holding every word of `query`; `searchResults(query, hits)` answers."""
        self._search_query = query
        if not query.strip():
            self.searchResults.emit(query, [])
            return
        engine = self.engine
        if engine is not None:
            fn, args = engine.search, (query, SEARCH_LIMIT)
        else:                                        # no engine (the model failed): read SQLite directly
            from evoke_engine import search_messages
            fn, args = search_messages, (self.settings, query, SEARCH_LIMIT)

        def failed(exc: BaseException) -> None:
            log.warning("search failed: %s", exc)
            if query == self._search_query:
                self.searchResults.emit(query, [])
                self.raise_error(f"The search failed: {error_text(exc)}")
        self.bridge.call(fn, *args, on_done=lambda hits: self._searched(query, hits), on_error=failed)

    def _searched(self, query: str, hits: list[Any]) -> None:
        if query == self._search_query:
            self.searchResults.emit(query, list(hits))

    def open_hit(self, conversation_id: str, message_id: int) -> None:
        """Open the hit's conversation and, once its messages are shown, reveal the message."""
        self._reveal = (conversation_id, int(message_id))
        shown = self.current_id or (self.viewed_id if self.conv is None else "")
        if conversation_id == shown and (self.history_loaded or self.conv is None):
            self.reveal_pending()
        else:
            self.open_conversation(conversation_id)

    def reveal_pending(self) -> None:
        """Called when a conversation's messages were shown: reveal the hit that opened it, if any."""
        if self._reveal is None:
            return
        conversation_id, message_id = self._reveal
        shown = self.current_id or self.viewed_id
        if conversation_id != shown:
            return
        self._reveal = None
        position = next((i for i, m in enumerate(self.messages) if m.row_id == message_id), -1)
        if position >= 0:
            self.messageRevealed.emit(position)
