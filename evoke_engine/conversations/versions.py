"""Versions of a message (regenerated replies, edited messages) and the undo of a delete.

Invariants: a live message's versions are the rows linked to it through `previous_id` (either way, deleted rows
left out), oldest first, the live one among them wherever it stands (another version can be made current,
`branches.switch_version`); reading them changes nothing. An undelete runs on the engine thread: it puts `deleted`
rows back into the live history and drops the conversation's open KV (slot, pool, file), then reopens it, so the
KV is rebuilt from SQLite and stays equal to the history.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import EditError
from ..store.history import DELETED, LIVE, HistoryDB, MessageRow

if TYPE_CHECKING:
    from .lifecycle import ConversationLifecycle


def version_chains(rows: list[MessageRow]) -> dict[int, list[MessageRow]]:
    """{live row id: its versions, oldest first} for every live row with other versions (rows linked by
    `previous_id`, either way; a deleted row is no version)."""
    kept = {r.id: r for r in rows if r.status != DELETED}
    linked: dict[int, set[int]] = {i: set() for i in kept}
    for row in kept.values():
        if row.previous_id is not None and row.previous_id in kept and row.previous_id != row.id:
            linked[row.id].add(row.previous_id)
            linked[row.previous_id].add(row.id)
    chains: dict[int, list[MessageRow]] = {}
    for row in kept.values():
        if row.status != LIVE:
            continue
        group, todo = {row.id}, [row.id]
        while todo:
            for other in linked[todo.pop()] - group:
                group.add(other)
                todo.append(other)
        if len(group) > 1:
            chains[row.id] = [kept[i] for i in sorted(group)]
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
