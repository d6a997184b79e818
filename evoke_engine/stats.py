"""One conversation's memory as the engine reports it to the app, the server and benches: a frozen snapshot.

Invariants: built on the engine thread (`ConversationMemory.stats`) and never changed after; a changed view
is a new object (`dataclasses.replace`); a conversation not measured yet reads as zeros (`ConversationStats(id)`).
The memory's running `Counters` are declared once, here: a snapshot carries every one of them under the same name
(its frozen, keyword-only copy of their fields), so a new counter is reported without being declared twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any


@dataclass
class Counters:
    """What one conversation's memory has done since it began: counts that only grow, written by its memory
    (memory.py) and kept in its KV file."""

    evictions: int = 0                   # blocks that left the context
    evicted_tokens: int = 0
    recoveries: int = 0                  # blocks brought back: saved K/V spliced in, or a breadcrumb decoded
    recovered_tokens: int = 0            # tokens spliced back (breadcrumbs not included)
    identity_hits: int = 0               # recoveries of a block whose content the message repeats (same hash)
    breadcrumbs: int = 0                 # markers decoded for blocks whose bytes were gone
    max_active_at_turn_end: int = 0
    prefill_tokens: int = 0              # tokens decoded by a forward pass
    reused_blocks: int = 0               # blocks spliced from another conversation's K/V (chunk index)
    reused_tokens: int = 0               # their tokens, spliced instead of decoded


# `Counters`' fields, frozen and keyword-only, as the base that gives `ConversationStats` the same names
_ReportedCounters = make_dataclass(
    "_ReportedCounters", [(f.name, f.type, field(default=f.default)) for f in fields(Counters)],
    frozen=True, kw_only=True)


@dataclass(frozen=True)
class ConversationStats(_ReportedCounters):
    conversation_id: str
    active_tokens: int = 0
    budget_tokens: int = 0
    cached_tokens: int = 0               # tokens of saved (RAM or disk) blocks
    prefix_tokens: int = 0
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
