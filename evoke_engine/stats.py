"""One conversation's memory as the engine reports it to the app, the server and benches: a frozen snapshot.

Invariants: built on the engine thread (`ConversationMemory.stats`) and never changed after; a changed view
is a new object (`dataclasses.replace`); a conversation not measured yet reads as zeros (`ConversationStats(id)`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class ConversationStats:
    conversation_id: str
    active_tokens: int = 0
    budget_tokens: int = 0
    cached_tokens: int = 0               # tokens of saved (RAM or disk) blocks
    prefix_tokens: int = 0
    evictions: int = 0
    recoveries: int = 0
    evicted_tokens: int = 0
    recovered_tokens: int = 0
    identity_hits: int = 0
    max_active_at_turn_end: int = 0
    prefill_tokens: int = 0
    reused_tokens: int = 0               # tokens spliced from other conversations' K/V instead of decoded
    turn: int = 0
    memory: str = "none"                 # slot | ram | disk | none
    recovery: str = ""                   # the recovery backend in use
    blocks: tuple[dict[str, Any], ...] = ()    # `Block.summary()` of every block, birth order
    events: tuple[dict[str, Any], ...] = ()    # the latest events, `EngineEvent.as_dict()`
    recovery_decisions: tuple[dict[str, Any], ...] = ()   # per recovered block, the signal values that chose it
    reply_context: tuple[str, ...] = ()  # names of the blocks resident when the last reply started (what it read)
    turn_breakdown: dict[str, Any] = field(default_factory=dict)   # the last turn's time by phase (breakdown.py)

    def as_dict(self) -> dict[str, Any]:
        """Plain data (lists, not tuples) for JSON and Qt signals: a copy of each row, not a deep copy (the window
        converts a snapshot of hundreds of blocks at every refresh on its GUI thread)."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "blocks": [dict(b) for b in self.blocks],
                "events": [dict(e) for e in self.events],
                "recovery_decisions": [dict(d) for d in self.recovery_decisions],
                "reply_context": list(self.reply_context), "turn_breakdown": dict(self.turn_breakdown)}
