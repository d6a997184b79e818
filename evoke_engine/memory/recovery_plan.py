"""A recovery decision as a value: what one message's recovery would bring back and keep, worked out before it is
carried out, so the decision can be made while the message is typed and reused when it is sent.

Invariants: a plan holds the inputs it was decided from (the message, its sizes, the settings, budget and embedder
objects, and the block table's `table_state`); `ConversationMemory` carries a plan out only while every one of them
is unchanged (`matches`), else it decides afresh. `done` lists what was already carried out ahead (restored while
the user typed), best ranked first; `picks` what is left to bring back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..kvcache.blocks import Block, BlockState, BlockTable
from ..settings import Settings
from .policy import RecoveryPick
from .recall_signals import RecallSignal


def table_state(table: BlockTable) -> tuple:
    """What a decision read of the table: each block (blocks compare by identity), where it is, how long, whether
    pinned and how it is weighted."""
    return tuple((blk, blk.state, blk.pos, len(blk.tokens), blk.pinned, blk.priority) for blk in table.blocks)


def staying_tokens(working: dict[Block, int], moved: Block | None = None) -> int:
    """Tokens of a wide recovery's working set that stay resident through the turn (`_carry_out` protects them), so
    the picks share the room with them: its resident blocks but `moved` (it leaves and comes back as a pick) and
    those the room counts already (shared or pinned). Left out, a turn held more than its limit when the reply began,
    and the reply's first room check evicted by score past the working set: the message's best match went first."""
    return sum(b.n_tokens for b in working
               if b.state is BlockState.RESIDENT and b is not moved and not (b.shared or b.pinned))


@dataclass
class RecoveryPlan:
    message: str
    message_tokens: int
    reply_reserve: int
    identity_hashes: frozenset[str]
    settings: Settings
    budget_tokens: int
    embedder: object
    table_seen: tuple                          # `table_state` when decided (or after the work done ahead)
    picks: list[RecoveryPick]                  # to bring back, in order
    signal: RecallSignal | None = None
    room: int = 0                              # tokens the picks may take within the budget
    wide: int = 0                              # how far past `room` they may go (a wide recovery's overdraft)
    working: dict[Block, int] = field(default_factory=dict)     # a wide recovery's working set, block -> rank
    move_best: Block | None = None             # the working set's best, resident, to move next to the message
    warming: bool = False                      # decided with the lexical signal while the embedder warmed up
    done: list[tuple[Block, dict]] = field(default_factory=list)   # brought back ahead, and why

    def matches(self, message: str, message_tokens: int, reply_reserve: int, identity_hashes: frozenset[str], *,
                settings: Settings, budget_tokens: int, embedder: object, table: BlockTable) -> bool:
        """True when a decision for these inputs, now, would be this plan."""
        return (self.message == message and self.message_tokens == message_tokens
                and self.reply_reserve == reply_reserve and self.identity_hashes == identity_hashes
                and self.settings is settings and self.budget_tokens == budget_tokens and self.embedder is embedder
                and self.table_seen == table_state(table))
