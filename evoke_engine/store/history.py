"""Chat history in SQLite, the source of truth: conversations and their messages.

Invariants: every message belongs to an existing conversation (foreign key, cascade on delete); adding a
message bumps its conversation's `updated_at`; rows leave as immutable dataclasses, never cursors.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evoke_engine.store.sqlite_db import Database, Migration

log = logging.getLogger(__name__)

Attachment = tuple[str, str]


@dataclass(frozen=True)
class ConversationRow:
    id: str
    title: str
    created_at: float
    updated_at: float
    pinned: bool
    system_prompt: str
    settings: dict[str, Any]


@dataclass(frozen=True)
class MessageRow:
    id: int
    conversation_id: str
    role: str
    text: str
    attachments: list[Attachment]
    created_at: float


def _create_schema_v1(conn: sqlite3.Connection) -> None:
    conn.execute("""
        CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            title TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            pinned INTEGER NOT NULL DEFAULT 0,
            system_prompt TEXT NOT NULL DEFAULT '',
            settings_json TEXT NOT NULL DEFAULT '{}'
        )""")
    conn.execute("""
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            role TEXT NOT NULL,
            text TEXT NOT NULL,
            attachments_json TEXT NOT NULL DEFAULT '[]',
            created_at REAL NOT NULL
        )""")
    conn.execute("CREATE INDEX messages_by_conversation ON messages(conversation_id, id)")
    conn.execute("CREATE INDEX conversations_by_update ON conversations(updated_at)")


MIGRATIONS: list[Migration] = [_create_schema_v1]

_CONVERSATION_COLUMNS = "id, title, created_at, updated_at, pinned, system_prompt, settings_json"


def _load_json(raw: str, default: Any, where: str) -> Any:
    try:
        return json.loads(raw)
    except (TypeError, ValueError) as error:
        log.warning("unreadable JSON in %s, using %r: %s", where, default, error)
        return default


def _conversation_of(row: sqlite3.Row | tuple[Any, ...]) -> ConversationRow:
    id_, title, created_at, updated_at, pinned, system_prompt, settings_json = row
    settings = _load_json(settings_json, {}, f"settings of conversation {id_}")
    return ConversationRow(id=id_, title=title, created_at=created_at, updated_at=updated_at,
                           pinned=bool(pinned), system_prompt=system_prompt,
                           settings=settings if isinstance(settings, dict) else {})


def _message_of(row: sqlite3.Row | tuple[Any, ...]) -> MessageRow:
    id_, conversation_id, role, text, attachments_json, created_at = row
    raw = _load_json(attachments_json, [], f"attachments of message {id_}")
    attachments = [(str(name), str(body)) for name, body in raw] if isinstance(raw, list) else []
    return MessageRow(id=id_, conversation_id=conversation_id, role=role, text=text,
                      attachments=attachments, created_at=created_at)


class HistoryDB:
    """Conversations and messages; safe to share between threads. Unknown ids raise KeyError."""

    def __init__(self, path: Path, *, busy_timeout_s: float = 5.0, read_only: bool = False) -> None:
        self._db = Database(Path(path), MIGRATIONS, busy_timeout_s=busy_timeout_s, read_only=read_only)
        self._db.connection.create_function("casefold", 1, _casefold, deterministic=True)

    @property
    def path(self) -> Path:
        return self._db.path

    @property
    def schema_version(self) -> int:
        return self._db.schema_version

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """Group several calls into one transaction: `with history.transaction(): ...`."""
        return self._db.transaction()

    def create_conversation(self, id: str, title: str, system_prompt: str,
                            settings: Mapping[str, Any] | None = None,
                            now: float | None = None) -> ConversationRow:
        stamp = time.time() if now is None else now
        settings_json = json.dumps(dict(settings or {}))
        with self._db.transaction() as conn:
            conn.execute(f"INSERT INTO conversations ({_CONVERSATION_COLUMNS}) VALUES (?, ?, ?, ?, 0, ?, ?)",
                         (id, title, stamp, stamp, system_prompt, settings_json))
        return ConversationRow(id=id, title=title, created_at=stamp, updated_at=stamp, pinned=False,
                               system_prompt=system_prompt, settings=json.loads(settings_json))

    def get_conversation(self, id: str) -> ConversationRow | None:
        with self._db.reading() as conn:
            row = conn.execute(f"SELECT {_CONVERSATION_COLUMNS} FROM conversations WHERE id = ?",
                               (id,)).fetchone()
        return None if row is None else _conversation_of(row)

    def list_conversations(self, search: str | None = None) -> list[ConversationRow]:
        """Newest activity first; `search` keeps titles containing it, ignoring case (Unicode casefold)."""
        query = f"SELECT {_CONVERSATION_COLUMNS} FROM conversations"
        params: tuple[Any, ...] = ()
        if search:
            query += " WHERE instr(casefold(title), ?) > 0"
            params = (search.casefold(),)
        query += " ORDER BY updated_at DESC, created_at DESC, rowid DESC"
        with self._db.reading() as conn:
            rows = conn.execute(query, params).fetchall()
        return [_conversation_of(row) for row in rows]

    def _update_conversation(self, id: str, assignments: str, params: tuple[Any, ...]) -> None:
        with self._db.transaction() as conn:
            cursor = conn.execute(f"UPDATE conversations SET {assignments} WHERE id = ?", (*params, id))
            if cursor.rowcount == 0:
                raise KeyError(f"no conversation with id {id!r}")

    def rename(self, id: str, title: str) -> None:
        self._update_conversation(id, "title = ?", (title,))

    def set_pinned(self, id: str, pinned: bool) -> None:
        self._update_conversation(id, "pinned = ?", (int(bool(pinned)),))

    def set_settings(self, id: str, settings: Mapping[str, Any]) -> None:
        self._update_conversation(id, "settings_json = ?", (json.dumps(dict(settings)),))

    def touch(self, id: str, now: float | None = None) -> None:
        self._update_conversation(id, "updated_at = ?", (time.time() if now is None else now,))

    def delete(self, id: str) -> bool:
        """Delete a conversation and (by cascade) its messages; False when it did not exist."""
        with self._db.transaction() as conn:
            return conn.execute("DELETE FROM conversations WHERE id = ?", (id,)).rowcount > 0

    def add_message(self, conversation_id: str, role: str, text: str,
                    attachments: Iterable[Attachment] = (), now: float | None = None) -> int:
        """Append a message and bump the conversation's `updated_at`; returns the message id."""
        stamp = time.time() if now is None else now
        attachments_json = json.dumps([[str(name), str(body)] for name, body in attachments])
        with self._db.transaction() as conn:
            self._update_conversation(conversation_id, "updated_at = ?", (stamp,))
            cursor = conn.execute(
                "INSERT INTO messages (conversation_id, role, text, attachments_json, created_at)"
                " VALUES (?, ?, ?, ?, ?)", (conversation_id, role, text, attachments_json, stamp))
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def messages(self, conversation_id: str) -> list[MessageRow]:
        """The conversation's messages in the order they were added (empty for an unknown id)."""
        with self._db.reading() as conn:
            rows = conn.execute(
                "SELECT id, conversation_id, role, text, attachments_json, created_at FROM messages"
                " WHERE conversation_id = ? ORDER BY id", (conversation_id,)).fetchall()
        return [_message_of(row) for row in rows]

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> HistoryDB:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _casefold(value: str | None) -> str | None:
    return None if value is None else value.casefold()
