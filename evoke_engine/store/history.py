"""Chat history in SQLite, the source of truth: conversations and their messages.

Invariants: every message belongs to an existing conversation (foreign key, cascade on delete); adding a
message bumps its conversation's `updated_at`; rows leave as immutable dataclasses, never cursors; an
edited, regenerated or deleted message is never erased at once: its row leaves the live history with a
status (`superseded`, `deleted`) and a replacement points back at it (`previous_id`) until `compact`.
A reply is written while it streams: its row carries `extra["interrupted"]` until the turn finalizes it,
so a row still flagged after a crash is a reply cut short (`MessageRow.interrupted`). A row hidden below another
version of an earlier message carries `extra["branch_of"]` (that version's id: the branch it comes back with,
`conversations.branches`); rows coming back live lose the mark. Live messages are indexed for full-text search by
SQLite triggers (`store.search`), so every write here keeps the index.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evoke_engine.store.search import SearchHit, add_message_search_v3, search_messages, search_titles
from evoke_engine.store.sqlite_db import Database, Migration

log = logging.getLogger(__name__)

Attachment = tuple[str, str]

LIVE, SUPERSEDED, DELETED = "live", "superseded", "deleted"
INTERRUPTED = "interrupted"     # the `extra` key of a reply row written while it streams (or cut short by a crash)
BRANCH_OF = "branch_of"         # the `extra` key of a row hidden in the branch below another version's row


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
    status: str = LIVE
    previous_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def interrupted(self) -> bool:
        """A reply still streaming, or cut short (the app was killed before the turn ended)."""
        return bool(self.extra.get(INTERRUPTED))

    @property
    def branch_of(self) -> int | None:
        """The id of the version row this hidden row follows (it comes back when that version is chosen)."""
        value = self.extra.get(BRANCH_OF)
        return value if isinstance(value, int) and self.status == SUPERSEDED else None


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


def _add_message_status_v2(conn: sqlite3.Connection) -> None:
    """Editing: a message row can leave the live history (status) and name the row it replaced."""
    conn.execute("ALTER TABLE messages ADD COLUMN status TEXT NOT NULL DEFAULT 'live'")
    conn.execute("ALTER TABLE messages ADD COLUMN previous_id INTEGER REFERENCES messages(id) ON DELETE SET NULL")
    conn.execute("ALTER TABLE messages ADD COLUMN extra_json TEXT NOT NULL DEFAULT '{}'")


MIGRATIONS: list[Migration] = [_create_schema_v1, _add_message_status_v2, add_message_search_v3]
_MESSAGE_COLUMNS = "id, conversation_id, role, text, attachments_json, created_at, status, previous_id, extra_json"

_EXTRA = "(CASE WHEN json_valid(extra_json) THEN extra_json ELSE '{}' END)"   # an unreadable one reads as {}

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
    id_, conversation_id, role, text, attachments_json, created_at, status, previous_id, extra_json = row
    raw = _load_json(attachments_json, [], f"attachments of message {id_}")
    attachments = [(str(name), str(body)) for name, body in raw] if isinstance(raw, list) else []
    extra = _load_json(extra_json, {}, f"extra fields of message {id_}")
    return MessageRow(id=id_, conversation_id=conversation_id, role=role, text=text,
                      attachments=attachments, created_at=created_at, status=status, previous_id=previous_id,
                      extra=extra if isinstance(extra, dict) else {})


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
                    attachments: Iterable[Attachment] = (), now: float | None = None, *,
                    previous_id: int | None = None, extra: Mapping[str, Any] | None = None) -> int:
        """Append a live message and bump the conversation's `updated_at`; returns the message id.
        `previous_id` names the row this one replaces (an edit or a regenerated reply)."""
        stamp = time.time() if now is None else now
        attachments_json = json.dumps([[str(name), str(body)] for name, body in attachments])
        with self._db.transaction() as conn:
            self._update_conversation(conversation_id, "updated_at = ?", (stamp,))
            cursor = conn.execute(
                "INSERT INTO messages (conversation_id, role, text, attachments_json, created_at, previous_id,"
                " extra_json) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, role, text, attachments_json, stamp, previous_id, json.dumps(dict(extra or {}))))
        if cursor.lastrowid is None:
            raise RuntimeError("SQLite returned no row id for an inserted message")
        return cursor.lastrowid

    def update_message(self, conversation_id: str, message_id: int, text: str, *,
                       extra: Mapping[str, Any] | None = None, now: float | None = None) -> None:
        """Replace a message's text and extra fields (a streaming reply's progress, then its final text) and
        bump the conversation's `updated_at`; KeyError when the row is not one of the conversation's."""
        stamp = time.time() if now is None else now
        with self._db.transaction() as conn:
            self._update_conversation(conversation_id, "updated_at = ?", (stamp,))
            cursor = conn.execute("UPDATE messages SET text = ?, extra_json = ? WHERE id = ? AND conversation_id = ?",
                                  (text, json.dumps(dict(extra or {})), message_id, conversation_id))
            if cursor.rowcount == 0:
                raise KeyError(f"no message {message_id} in conversation {conversation_id!r}")

    def messages(self, conversation_id: str, *, include_hidden: bool = False) -> list[MessageRow]:
        """The conversation's live messages in the order they were added (empty for an unknown id);
        `include_hidden` adds superseded and deleted rows (undo, export of every version)."""
        where = "" if include_hidden else f" AND status = '{LIVE}'"
        with self._db.reading() as conn:
            rows = conn.execute(f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ?{where}"
                                " ORDER BY id", (conversation_id,)).fetchall()
        return [_message_of(row) for row in rows]

    def hide_messages(self, conversation_id: str, message_ids: Iterable[int], status: str, *,
                      branch_of: int | None = None) -> None:
        """Take messages out of the live history (`superseded` or `deleted`); the rows stay until `compact`.
        `branch_of` marks them as the branch below that version row (they come back with it); without it any
        earlier mark goes."""
        if status not in (SUPERSEDED, DELETED):
            raise ValueError(f"unknown message status {status!r}")
        ids = list(message_ids)
        mark = (f"json_set({_EXTRA}, '$.{BRANCH_OF}', ?)" if branch_of is not None
                else f"json_remove({_EXTRA}, '$.{BRANCH_OF}')")
        params = (branch_of,) if branch_of is not None else ()
        with self._db.transaction() as conn:
            conn.executemany(f"UPDATE messages SET status = ?, extra_json = {mark}"
                             " WHERE id = ? AND conversation_id = ?",
                             [(status, *params, i, conversation_id) for i in ids])

    def restore_messages(self, conversation_id: str, message_ids: Iterable[int]) -> None:
        """Put hidden rows back into the live history (undo of a failed or cancelled edit, a branch chosen again);
        their branch mark goes."""
        with self._db.transaction() as conn:
            conn.executemany(f"UPDATE messages SET status = '{LIVE}', extra_json = json_remove({_EXTRA}, "
                             f"'$.{BRANCH_OF}') WHERE id = ? AND conversation_id = ?",
                             [(i, conversation_id) for i in message_ids])

    def search(self, text: str, limit: int = 50, *, titles: bool = False) -> list[SearchHit]:
        """Live messages whose text or attachment names hold every word of `text` (FTS5, `store.search`); with
        `titles`, the conversations whose title holds every word come first (`SearchHit.is_title`), `limit` hits
        in all."""
        with self._db.reading() as conn:
            title_hits = search_titles(conn, text, limit) if titles else []
            return title_hits + search_messages(conn, text, limit - len(title_hits))

    def compact(self, conversation_id: str) -> int:
        """Erase the conversation's superseded and deleted rows; returns how many went."""
        with self._db.transaction() as conn:
            return conn.execute(f"DELETE FROM messages WHERE conversation_id = ? AND status != '{LIVE}'",
                                (conversation_id,)).rowcount

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> HistoryDB:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _casefold(value: str | None) -> str | None:
    return None if value is None else value.casefold()
