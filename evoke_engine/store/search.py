"""Full-text search over the live chat history with SQLite FTS5: the index, its migration and the query; and the
conversations whose title holds every word (`search_titles`: a title hit has `message_id` 0 and role "title").

Invariants: `message_search` holds exactly the live messages (rowid = messages.id; their text and attachment
names, never attachment bodies); SQLite triggers keep it so on every insert, text or status update (a reply
rewritten while it streams, an edit, a delete, an undo) and row delete (a cascade included), so no writer can
forget it; user input never reaches FTS5 as query syntax: every term is quoted, and a query FTS5 still refuses
gives no hits rather than an error.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass

SEARCH_TABLE = "message_search"
MARK_START, MARK_END = "\x02", "\x03"    # around each match in `SearchHit.snippet` (never in chat text)
SNIPPET_TOKENS = 14
MAX_TERMS = 16

# The attachment names of a row (`attachments_json` is [[name, body], ...]); '' for anything else.
_NAMES_OF = """(SELECT coalesce(group_concat(json_extract(value, '$[0]'), ' '), '')
               FROM json_each(CASE WHEN json_valid({row}.attachments_json) THEN {row}.attachments_json ELSE '[]' END)
               WHERE type = 'array')"""
_INDEX_ROW = (f"INSERT INTO {SEARCH_TABLE} (rowid, text, names) "
              "SELECT {row}.id, {row}.text, " + _NAMES_OF + " WHERE {row}.status = 'live'")


def add_message_search_v3(conn: sqlite3.Connection) -> None:
    """Migration: the FTS5 index over live messages, filled from the rows already there, and its triggers."""
    conn.execute(f"CREATE VIRTUAL TABLE {SEARCH_TABLE} USING fts5(text, names, "
                 "tokenize = 'unicode61 remove_diacritics 2')")
    conn.execute(f"INSERT INTO {SEARCH_TABLE} (rowid, text, names) SELECT m.id, m.text, "
                 + _NAMES_OF.format(row="m") + " FROM messages AS m WHERE m.status = 'live'")
    conn.execute(f"""CREATE TRIGGER message_search_insert AFTER INSERT ON messages BEGIN
                         {_INDEX_ROW.format(row="new")};
                     END""")
    conn.execute(f"""CREATE TRIGGER message_search_update AFTER UPDATE OF text, attachments_json, status
                     ON messages BEGIN
                         DELETE FROM {SEARCH_TABLE} WHERE rowid = old.id;
                         {_INDEX_ROW.format(row="new")};
                     END""")
    conn.execute(f"""CREATE TRIGGER message_search_delete AFTER DELETE ON messages BEGIN
                         DELETE FROM {SEARCH_TABLE} WHERE rowid = old.id;
                     END""")


TITLE_ROLE = "title"           # the role of a hit on a conversation's title (its `message_id` is 0)


@dataclass(frozen=True)
class SearchHit:
    """One live message that matches, or a conversation's title (role TITLE_ROLE, message_id 0); `snippet` marks
    each match with MARK_START ... MARK_END."""
    conversation_id: str
    title: str
    message_id: int
    role: str
    snippet: str
    created_at: float

    def snippet_marked(self, start: str = "[", end: str = "]") -> str:
        return self.snippet.replace(MARK_START, start).replace(MARK_END, end)

    @property
    def plain_snippet(self) -> str:
        return self.snippet_marked("", "")

    @property
    def is_title(self) -> bool:
        return self.role == TITLE_ROLE


def search_terms(text: str) -> list[str]:
    """The words of `text` a search looks for (at most MAX_TERMS; a term needs a letter or digit)."""
    return [t for t in text.split() if re.search(r"\w", t)][:MAX_TERMS]


def fts_query(text: str) -> str | None:
    """An FTS5 query matching messages that hold every word of `text` (the last one as a prefix, for typing
    as you search); None when `text` has no word. Each term is a quoted string, so `"`, `AND`, `*`, `(` or
    `col:` are searched for as text, never parsed as syntax."""
    terms = search_terms(text)
    if not terms:
        return None
    quoted = ['"' + t.replace('"', '""') + '"' for t in terms]
    quoted[-1] += "*"
    return " ".join(quoted)


def search_messages(conn: sqlite3.Connection, text: str, limit: int = 50) -> list[SearchHit]:
    """Live messages matching `text`, best match first (FTS5 rank, then newest); [] for no word or a query
    FTS5 refuses."""
    query = fts_query(text)
    if query is None or limit <= 0:
        return []
    sql = (f"SELECT m.conversation_id, c.title, m.id, m.role, "
           f"snippet({SEARCH_TABLE}, -1, ?, ?, '…', {SNIPPET_TOKENS:d}), m.created_at "
           f"FROM {SEARCH_TABLE} JOIN messages AS m ON m.id = {SEARCH_TABLE}.rowid "
           f"JOIN conversations AS c ON c.id = m.conversation_id "
           f"WHERE {SEARCH_TABLE} MATCH ? AND m.status = 'live' "
           f"ORDER BY {SEARCH_TABLE}.rank, m.created_at DESC LIMIT ?")
    try:
        rows = conn.execute(sql, (MARK_START, MARK_END, query, int(limit))).fetchall()
    except sqlite3.OperationalError as error:
        if "fts5" in str(error) or "syntax" in str(error):
            return []
        raise
    return [SearchHit(conversation_id=cid, title=title, message_id=mid, role=role, snippet=snippet or "",
                      created_at=created_at) for cid, title, mid, role, snippet, created_at in rows]


def mark_title(title: str, terms: list[str]) -> str | None:
    """`title` with each occurrence of every term marked (ignoring case), or None when a term is missing."""
    folded = title.casefold()
    if len(folded) != len(title):                  # casefold changed the length (ß -> ss): compare, mark nothing
        return title if all(t.casefold() in folded for t in terms) else None
    spans: list[tuple[int, int]] = []
    for term in terms:
        needle = term.casefold()
        start = folded.find(needle)
        if start < 0:
            return None
        while start >= 0:
            spans.append((start, start + len(needle)))
            start = folded.find(needle, start + len(needle))
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    marked, at = [], 0
    for start, end in merged:
        marked += [title[at:start], MARK_START, title[start:end], MARK_END]
        at = end
    return "".join(marked) + title[at:]


def search_titles(conn: sqlite3.Connection, text: str, limit: int = 50) -> list[SearchHit]:
    """Conversations whose title holds every word of `text` (anywhere in the title, ignoring case), newest
    activity first, as hits with role TITLE_ROLE and message_id 0; [] for no word."""
    terms = search_terms(text)
    if not terms or limit <= 0:
        return []
    hits: list[SearchHit] = []
    for cid, title, updated_at in conn.execute("SELECT id, title, updated_at FROM conversations "
                                               "ORDER BY updated_at DESC, created_at DESC, rowid DESC"):
        snippet = mark_title(title or "", terms)
        if snippet is not None:
            hits.append(SearchHit(conversation_id=cid, title=title, message_id=0, role=TITLE_ROLE,
                                  snippet=snippet, created_at=updated_at))
            if len(hits) >= limit:
                break
    return hits
