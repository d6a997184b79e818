"""Conversation editing on the KV, on the engine thread: truncate, regenerate, edit, fork, delete.

Invariants: after each operation the conversation's live SQLite messages and its template history
agree one to one, and its KV holds exactly the blocks of those messages (what a clean re-prefill
would decode, up to eviction), or the open state is discarded and rebuilt from SQLite on next use;
rows leave the live history as `superseded`/`deleted`, never erased here; the messages after an edited one leave
marked as the old version's branch (`hide_from`), so choosing that version brings them back (`branches`). Each
operation is given the open conversations (`ConversationLifecycle`: the history store and the loaded model come
with them), never the Engine.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from jinja2.exceptions import TemplateError

from ..errors import EditError
from ..store.history import DELETED, SUPERSEDED, MessageRow
from .turn import message_key

if TYPE_CHECKING:
    from .lifecycle import ConversationLifecycle, ConversationState

log = logging.getLogger(__name__)


def aligned_rows(conversations: ConversationLifecycle,
                 state: ConversationState) -> tuple[list[MessageRow], ConversationState]:
    """The live rows of a conversation and its open state, rebuilt from SQLite if the two disagree."""
    rows = conversations.history.messages(state.id)
    if [r.role for r in rows] != [m.get("role") for m in state.history]:
        log.warning("history of %s disagrees with its KV state: rebuilt from SQLite", state.id)
        conversations.discard(state, "its history and its cache disagreed")
        state = conversations.open(state.id)
        rows = conversations.history.messages(state.id)
    conversations.ensure_slot(state)
    return rows, state


def truncate_state(conversations: ConversationLifecycle, state: ConversationState, n_messages: int) -> None:
    """Keep the first `n_messages` of the template history; every block of no kept message (later
    messages, and a failed turn's half-written reply) leaves for good."""
    kept = {message_key(m) for m in state.history[:n_messages]}
    doomed = [b for b in state.memory.table.blocks if not b.shared and b.message_key() not in kept]
    if not doomed and n_messages >= len(state.history):
        return
    conversations.ensure_slot(state)
    state.memory.remove_blocks(doomed)
    del state.history[n_messages:]
    state.memory.settle_rollback(max((m["evoke_turn"] for m in state.history), default=0))


def truncate(conversations: ConversationLifecycle, conversation_id: str, n_messages: int) -> None:
    state = conversations.open(conversation_id)
    rows, state = aligned_rows(conversations, state)
    if not 0 <= n_messages <= len(rows):
        raise EditError(f"cannot keep {n_messages} messages of {len(rows)}")
    conversations.history.hide_messages(state.id, [r.id for r in rows[n_messages:]], SUPERSEDED)
    try:
        truncate_state(conversations, state, n_messages)
    except Exception as exc:  # noqa: BLE001 - any failure: rebuild from SQLite, never a wrong cache
        conversations.discard(state, f"truncation failed: {exc}")
        return
    conversations.refresh(state)


def hide_from(conversations: ConversationLifecycle, conversation_id: str, rows: Sequence[MessageRow],
              position: int) -> None:
    """Live `rows[position]` leaves as a version (no mark) and every later live row as its branch."""
    head = rows[position]
    with conversations.history.transaction():
        conversations.history.hide_messages(conversation_id, [head.id], SUPERSEDED)
        conversations.history.hide_messages(conversation_id, [r.id for r in rows[position + 1:]], SUPERSEDED,
                                            branch_of=head.id)


def rewind_for_edit(conversations: ConversationLifecycle, state: ConversationState,
                    index: int) -> tuple[MessageRow, list[MessageRow]]:
    """Before an edit of user message `index`: it and every later message leave (rows superseded)."""
    rows, state = aligned_rows(conversations, state)
    if not 0 <= index < len(rows) or rows[index].role != "user":
        raise EditError(f"message {index} is not a user message of this conversation")
    truncate_state(conversations, state, index)
    hide_from(conversations, state.id, rows, index)
    return rows[index], rows[index:]


def rewind_for_regenerate(conversations: ConversationLifecycle, state: ConversationState) -> MessageRow:
    """Before a regenerate: the last reply leaves (its row superseded); returns that row."""
    rows, state = aligned_rows(conversations, state)
    if not rows or rows[-1].role != "assistant":
        raise EditError("there is no reply to regenerate: the last message is not the assistant's")
    truncate_state(conversations, state, len(rows) - 1)
    conversations.history.hide_messages(state.id, [rows[-1].id], SUPERSEDED)
    return rows[-1]


def fork(conversations: ConversationLifecycle, conversation_id: str, message_index: int) -> str:
    """A new conversation holding the parent's messages up to `message_index`, its KV shared with the parent."""
    parent = conversations.open(conversation_id)
    rows, parent = aligned_rows(conversations, parent)
    if not 0 <= message_index < len(rows):
        raise EditError(f"no message {message_index} in a conversation of {len(rows)}")
    row = conversations.history.get_conversation(parent.id)
    settings = dict(row.settings) if row and isinstance(row.settings, dict) else {}
    settings.update(forked_from=parent.id, forked_at=message_index)
    child_id = uuid.uuid4().hex
    with conversations.history.transaction():
        conversations.history.create_conversation(child_id, f"{parent.title} (fork)", parent.system_prompt, settings)
        for r in rows[:message_index + 1]:
            conversations.history.add_message(child_id, r.role, r.text, r.attachments, extra=r.extra)
    if conversations.model.settings.slots < 2:                      # no second slot to share cells with: rebuild
        conversations.open(child_id)
        return child_id
    child = conversations.fresh_state(child_id, f"{parent.title} (fork)", parent.system_prompt, parent.tools)
    conversations.adopt(child, parent.prefix)
    try:
        conversations.ensure_slot(child, keep=parent.id)
        parent.memory.share_into(child.memory)
        child.history = [dict(m) for m in parent.history]
        truncate_state(conversations, child, message_index + 1)
        child.memory.check()
    except Exception as exc:  # noqa: BLE001 - the fork still exists in SQLite: rebuild it from there
        conversations.discard(child, f"fork could not share the parent's cache: {exc}")
        conversations.open(child_id)
    child.last_used = conversations.clock()
    conversations.refresh(parent)
    conversations.refresh(child)
    return child_id


def delete_message(conversations: ConversationLifecycle, conversation_id: str, index: int) -> None:
    """One message leaves the middle of a conversation: its blocks leave the context with no recovery."""
    state = conversations.open(conversation_id)
    rows, state = aligned_rows(conversations, state)
    if not 0 <= index < len(rows):
        raise EditError(f"no message {index} in a conversation of {len(rows)}")
    old = state.history
    new = old[:index] + old[index + 1:]
    try:
        stable = _later_segments_unchanged(conversations, state, old, new, index)
    except TemplateError as exc:
        raise EditError(f"this model's chat template cannot render the conversation without that message "
                        f"({exc}); delete the exchange instead") from exc
    conversations.history.hide_messages(state.id, [rows[index].id], DELETED)
    if not stable:
        conversations.discard(state, "the template renders later messages differently without it")
        return
    try:
        key = message_key(old[index])
        state.memory.remove_blocks(b for b in state.memory.table.blocks if not b.shared and b.message_key() == key)
        state.history = new
        state.memory.settle_rollback(state.memory.turn)
    except Exception as exc:  # noqa: BLE001
        conversations.discard(state, f"removing the message's blocks failed: {exc}")
        return
    conversations.refresh(state)


def _later_segments_unchanged(conversations: ConversationLifecycle, state: ConversationState, old: list[dict],
                              new: list[dict], index: int) -> bool:
    """Whether every message after `index` renders to the same text with the message gone."""
    head = [state.system_message]
    for k in range(index, len(new)):
        before = conversations.model.template.segment([*head, *old[:k + 1]], old[k + 1])
        after = conversations.model.template.segment([*head, *new[:k]], new[k])
        if before != after:
            return False
    if new:
        conversations.model.template.render([*head, *new])            # raises when the template refuses the history
    return True
