"""Earlier versions of a message (regenerated replies, edited messages) and the undo of a delete.

Invariants: a live message's versions are the rows its `previous_id` chain names, oldest first and the live
row last; reading them changes nothing. An undelete runs on the engine thread: it puts `deleted` rows back into
the live history and drops the conversation's open KV (slot, pool, file), then reopens it, so the KV is rebuilt
from SQLite and stays equal to the history.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import EditError
from ..store.history import DELETED, LIVE, HistoryDB, MessageRow

if TYPE_CHECKING:
    from .lifecycle import ConversationLifecycle


def version_chains(rows: list[MessageRow]) -> dict[int, list[MessageRow]]:
    """{live row id: its versions, oldest first, the live row last} for every live row that replaced others."""
    by_id = {r.id: r for r in rows}
    chains: dict[int, list[MessageRow]] = {}
    for row in rows:
        if row.status != LIVE:
            continue
        chain, seen = [row], {row.id}
        while (earlier := chain[-1].previous_id) is not None and earlier in by_id and earlier not in seen:
            chain.append(by_id[earlier])
            seen.add(earlier)
        if len(chain) > 1:
            chains[row.id] = chain[::-1]
    return chains


def versions_of(history: HistoryDB, conversation_id: str) -> dict[int, list[dict]]:
    """{live message id: [{"id", "text", "status", "created_at"}, ...] oldest first} (any thread: SQLite only)."""
    rows = history.messages(conversation_id, include_hidden=True)
    return {live_id: [{"id": r.id, "text": r.text, "status": r.status, "created_at": r.created_at} for r in chain]
            for live_id, chain in version_chains(rows).items()}


def undelete(history: HistoryDB, lifecycle: ConversationLifecycle, conversation_id: str,
             message_ids: list[int]) -> list[int]:
    """Put deleted messages back (engine thread); returns the ids restored. EditError when none of them is a
    deleted message of the conversation."""
    rows = {r.id: r for r in history.messages(conversation_id, include_hidden=True)}
    ids = [i for i in message_ids if i in rows and rows[i].status == DELETED]
    if not ids:
        raise EditError("there is no deleted message to restore")
    history.restore_messages(conversation_id, ids)
    state = lifecycle.get(conversation_id)
    if state is not None:
        lifecycle.discard(state, "a deleted message came back")
    lifecycle.open(conversation_id)          # rebuilt from SQLite now, not at the next message
    return ids
