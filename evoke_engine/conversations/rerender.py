"""Keeping a conversation's KV equal to the whole render when its chat template rewrites earlier messages
(`ChatTemplate.stable` false: Qwen3 drops an older reply's thinking, Mistral moves the system prompt to the last user
message, Phi-3 ends a render with its EOS, Qwen2.5 closes a run of tool results after its last one).

Invariant: after `settle(conversations, state, upcoming)` the KV holds, for every message, exactly the tokens of its
segment in the render of the history followed by `upcoming` (`settled_segments`); the first message whose tokens
differ and every later one are decoded again from their text (history and SQLite are not touched). The first settle
of a conversation's memory (a new one: opened, rebuilt or restored) checks every message; later ones check from the
turn before the last (the templates known rewrite only the last turn's messages). A `stable` template needs none of
it: nothing is rendered or decoded.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..kvcache.blocks import Block
from ..runtime.template import ChatTemplate, Segment
from . import editing
from .turn import message_blocks, message_key, split_tokens

if TYPE_CHECKING:
    from .lifecycle import ConversationLifecycle, ConversationState

log = logging.getLogger(__name__)
_SETTLED: weakref.WeakSet = weakref.WeakSet()          # memories settled once: later settles check the last turn


def checked_from(history: Sequence[dict], *, settled_before: bool = True) -> int:
    """The first message `settle` checks: the input of the turn before the last (0 when there is none, or when the
    conversation was never settled)."""
    inputs = [k for k, m in enumerate(history) if m.get("role") != "assistant"]
    return inputs[-2] if settled_before and len(inputs) >= 2 else 0


def first_stale(held: Sequence[Sequence], expected: Sequence[Sequence]) -> int | None:
    """The first index where what the KV holds differs from what the render gives now (a message missing from
    the KV is stale too), or None."""
    for k, want in enumerate(expected):
        if k >= len(held) or list(held[k]) != list(want):
            return k
    return None


def expected_segments(template: ChatTemplate, system: dict | None, history: Sequence[dict],
                      upcoming: dict, *, settled_before: bool = True) -> tuple[int, list[Segment]]:
    """(first index checked, the segments of `history[first:]` as the render after `upcoming` cuts them)."""
    head = [system] if system else []
    first = checked_from(history, settled_before=settled_before)
    return first, template.settled_segments([*head, *history, upcoming], start=len(head) + first)


def settle(conversations: ConversationLifecycle, state: ConversationState, upcoming: dict) -> int:
    """Before a turn whose input is `upcoming`: decode again the messages whose text the template now renders
    otherwise, from the first of them on. Returns the tokens decoded (0: the KV already agreed)."""
    model = conversations.model
    template, rt = model.template, model.rt
    if template.stable or not state.history:
        return 0
    rows = conversations.history.messages(state.id)
    if [r.role for r in rows] != [m.get("role") for m in state.history]:
        return 0                    # `aligned_rows` rebuilds such a conversation before it is used
    first, segments = expected_segments(template, state.system_message, state.history, upcoming,
                                        settled_before=state.memory in _SETTLED)
    _SETTLED.add(state.memory)
    block_tokens = model.settings.block_tokens
    blocks = [b for b in state.memory.table.blocks if not b.shared]
    held, wanted = [], []
    for k, segment in enumerate(segments, start=first):
        message, row = state.history[k], rows[k]
        held.append([t for b in blocks if b.message_key() == message_key(message) for t in b.tokens])
        wanted.append(_blocks_of(rt, segment, message, row, block_tokens))
    stale = first_stale(held, [[t for b in bs for t in b.tokens] for bs in wanted])
    if stale is None:
        return 0
    at = first + stale
    kept_messages = state.history[at:]
    log.info("%s: the template renders message %d on otherwise now; %d messages decode again",
             state.id, at, len(kept_messages))
    editing.truncate_state(conversations, state, at)
    state.ahead = None                              # prepared against the KV as it was
    decoded = 0
    memory = state.memory
    for message, message_blocks_ in zip(kept_messages, wanted[stale:], strict=True):
        turn = message["evoke_turn"]
        memory.begin_turn(turn)
        if message.get("role") != "assistant":
            memory.set_query(rows[len(state.history)].text or message.get("content", "")[:2000])
        for block in message_blocks_:
            memory.append_decoded(block)
            decoded += block.n_tokens
        state.history.append(message)
        if message.get("role") == "assistant":
            if memory.query is not None:
                memory.focus.update(memory.query)
            memory.end_turn()
    return decoded


def _blocks_of(rt, segment: Segment, message: dict, row, block_tokens: int) -> list[Block]:
    """The blocks a message's segment decodes as: an input's as a turn makes them, a reply's in block-sized parts
    of its tokens (content as text, markup as the template's special tokens)."""
    turn = message["evoke_turn"]
    if message.get("role") != "assistant":
        return message_blocks(rt, segment, row.text, row.attachments, turn, block_tokens)
    tokens = rt.tokenize_parts(segment.parts())
    return [Block(name=f"assistant#{turn}" if k == 0 else f"assistant#{turn}.{k}", role="assistant", turn=turn,
                  tokens=chunk, text=rt.detokenize(chunk))
            for k, chunk in enumerate(split_tokens(rt, tokens, block_tokens))]
