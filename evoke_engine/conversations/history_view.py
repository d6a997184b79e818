"""Chat history read without a model: the conversation list and a conversation's messages, straight
from SQLite (the source of truth), for a window whose model failed to load.

Invariants: read-only (the file is opened with `mode=ro`, never created or migrated); no llama.cpp, no
engine thread; rows come out in the shapes `Engine.conversations()` and `Conversation.messages()` give;
a history that does not exist yet reads as empty; one that cannot be read raises `StoreError`.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass

from ..settings import Settings
from ..store.history import HistoryDB
from ..store.search import SearchHit


@dataclass
class ConversationInfo:
    """One row of the conversation list (`Engine.conversations()`, `read_conversations`)."""

    id: str
    title: str
    updated_at: float
    pinned: bool
    memory: str            # slot | ram | disk | none
    forked_from: str | None = None
    source: str = "app"    # app | api (made through the OpenAI-compatible endpoint)
    stateless: bool = False  # an API conversation of requests without a session: deleted after its TTL


def history_path(settings: Settings):
    return settings.data_dir / "history.sqlite3"


def read_conversations(settings: Settings) -> list[ConversationInfo]:
    """Every conversation, newest activity first, as `ConversationInfo` (memory "none": no cache is read)."""
    path = history_path(settings)
    if not path.exists():
        return []
    with closing(HistoryDB(path, read_only=True)) as history:
        rows = history.list_conversations()
    out = []
    for row in rows:
        meta = row.settings if isinstance(row.settings, dict) else {}
        parent = meta.get("forked_from")
        out.append(ConversationInfo(row.id, row.title, row.updated_at, row.pinned, "none",
                                    forked_from=parent if isinstance(parent, str) else None,
                                    source=str(meta.get("source", "app")), stateless=bool(meta.get("stateless"))))
    return out


def read_messages(settings: Settings, conversation_id: str) -> list[dict]:
    """The conversation's live messages (empty for an unknown id), as `Conversation.messages()` gives them."""
    path = history_path(settings)
    if not path.exists():
        return []
    with closing(HistoryDB(path, read_only=True)) as history:
        rows = history.messages(conversation_id)
    return [{"role": m.role, "text": m.text, "attachments": m.attachments, "created_at": m.created_at,
             "id": m.id, "extra": m.extra} for m in rows]


def search_messages(settings: Settings, query: str, limit: int = 50) -> list[SearchHit]:
    """`Engine.search` without an engine: conversations whose title matches `query`, then live messages
    (SearchHit), [] with no history."""
    path = history_path(settings)
    if not path.exists():
        return []
    with closing(HistoryDB(path, read_only=True)) as history:
        return history.search(query, limit, titles=True)
