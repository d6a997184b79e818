"""Branches of a conversation on the engine thread: another version of a message made current (the messages that
followed it come back with it), and a reply's text edited.

Invariants: SQLite says which rows are live; a version's branch is the rows hidden with `extra["branch_of"]` = its
id (`store.history`), marked when they left: a version leaving the live history takes every later live message
with it, marked as its branch, and the chosen version brings its own branch back, in id order. After each change
the KV is cut at the changed message and the new live messages are decoded from their history text (as a rebuild
would), or dropped to be rebuilt from SQLite when that fails: live rows and KV agree one to one as after an edit.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..errors import EditError
from ..store.history import LIVE
from .editing import aligned_rows, hide_from, truncate_state
from .versions import version_chains

if TYPE_CHECKING:
    from .lifecycle import ConversationLifecycle, ConversationState

log = logging.getLogger(__name__)


def switch_version(conversations: ConversationLifecycle, conversation_id: str, message_id: int) -> int:
    """Make version `message_id` of a message current: the live version and the messages after it leave (kept as
    that version's branch), `message_id` and its own branch come back. Returns the message's position; EditError
    when `message_id` is no version of a live message."""
    state = conversations.open(conversation_id)
    rows, state = aligned_rows(conversations, state)
    every = conversations.history.messages(state.id, include_hidden=True)
    chains = version_chains(every)
    position = next((i for i, r in enumerate(rows) if message_id in {v.id for v in chains.get(r.id, [r])}), None)
    if position is None:
        raise EditError(f"message {message_id} is no version of a message of this conversation")
    if rows[position].id == message_id:
        return position
    chosen = next(r for r in every if r.id == message_id)
    branch = [r for r in every if r.branch_of == message_id]
    with conversations.history.transaction():
        hide_from(conversations, state.id, rows, position)
        conversations.history.restore_messages(state.id, [chosen.id, *(r.id for r in branch)])
    _redecode_from(conversations, state, position, "the chosen version")
    return position


def edit_reply(conversations: ConversationLifecycle, conversation_id: str, index: int, text: str) -> int:
    """Replace the text of reply `index` (a new version of it; the old one and the messages after it stay
    reachable as its branch); the KV is rebuilt from that reply on. Returns the new row's id."""
    if not text.strip():
        raise EditError("a reply cannot be edited to nothing: delete it instead")
    state = conversations.open(conversation_id)
    rows, state = aligned_rows(conversations, state)
    if not 0 <= index < len(rows) or rows[index].role != "assistant":
        raise EditError(f"message {index} is not a reply of this conversation")
    old = rows[index]
    with conversations.history.transaction():
        hide_from(conversations, state.id, rows, index)
        new_id = conversations.history.add_message(state.id, "assistant", text, previous_id=old.id,
                                                   extra={"edited": True})
    _redecode_from(conversations, state, index, "the edited reply")
    return new_id


def _redecode_from(conversations: ConversationLifecycle, state: ConversationState, position: int,
                   what: str) -> None:
    """Cut the KV at `position` and decode the live messages from there on from SQLite; on any failure the KV
    is dropped, to be rebuilt from SQLite at its next use."""
    live = [r for r in conversations.history.messages(state.id) if r.status == LIVE]
    try:
        truncate_state(conversations, state, position)
        if live[position:]:
            conversations._replay(state, live[position:], what)
    except Exception as exc:  # noqa: BLE001 - SQLite is right; the cache is rebuilt from it
        log.warning("%s of %s: KV not rebuilt in place (%s)", what, state.id, exc)
        conversations.discard(state, f"{what} did not decode ({exc})")
        return
    conversations.refresh(state)
