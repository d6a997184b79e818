"""Recovery backends as strategies: what an eviction keeps of a block, and how a needed block comes back.

Invariants: one stateless strategy per name of `Settings.recovery` (`BACKENDS`, the same names as
`settings.RECOVERY_BACKENDS`); `backend(name)` lists the valid names for a wrong one; only these classes decide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .blocks import Block, BlockState
from .errors import RestoreError
from .events import EventKind
from .policy import RecoveryPick

if TYPE_CHECKING:
    from .memory import ConversationMemory


class RecoveryBackend:
    """What eviction keeps and what recovery brings back; the defaults keep and bring back nothing."""

    name = ""
    evicts = True               # False: the conversation grows to the context (no eviction at all)
    keeps_bytes = False         # True: victims' K/V go to the pool before they leave the context

    def candidates(self, memory: ConversationMemory) -> list[Block]:
        """Blocks out of the context that this backend could bring back now."""
        return []

    def bring_back(self, memory: ConversationMemory, pick: RecoveryPick, detail: dict | None = None) -> Block | None:
        """Put the picked block's content back at the tail; the block now resident, or None if it failed.
        `detail` (the signal values that chose it) goes into the recovery event."""
        raise NotImplementedError(f"recovery {self.name!r} brings nothing back")


class Discard(RecoveryBackend):
    """Evicted blocks are dropped and nothing comes back."""

    name = "discard"


class KVRestore(RecoveryBackend):
    """Victims' K/V bytes are kept (RAM, then disk) and spliced back with a RoPE re-anchor: no forward pass."""

    name = "kv_restore"
    keeps_bytes = True

    def candidates(self, memory: ConversationMemory) -> list[Block]:
        return [b for b in memory.table.saved() if b in memory.pool]

    def bring_back(self, memory: ConversationMemory, pick: RecoveryPick, detail: dict | None = None) -> Block | None:
        try:
            memory.restore_block(pick.block)
        except RestoreError as exc:
            memory.record_event(EventKind.ERROR, f"could not restore {pick.block.name}: {exc}", pick.block)
            return None
        memory.record_event(EventKind.RECOVERED, f"recovered {pick.block.name} ({pick.reason}, "
                                                 f"similarity {pick.similarity:.2f})", pick.block, detail=detail)
        return pick.block


class Breadcrumb(RecoveryBackend):
    """Victims are dropped; a needed one comes back as a short decoded marker of its text."""

    name = "breadcrumb"

    def candidates(self, memory: ConversationMemory) -> list[Block]:
        marked = {b.name.removeprefix("breadcrumb:") for b in memory.table.resident if b.role == "breadcrumb"}
        return [b for b in memory.table.blocks if b.state is BlockState.DROPPED and b.role != "breadcrumb"
                and b.name not in marked]        # dropped blocks whose marker is not in the context now

    def bring_back(self, memory: ConversationMemory, pick: RecoveryPick, detail: dict | None = None) -> Block | None:
        return memory.add_breadcrumb(pick.block, detail)


class NoEviction(RecoveryBackend):
    """Nothing is ever evicted (the ceiling of every comparison)."""

    name = "none"
    evicts = False


BACKENDS: dict[str, RecoveryBackend] = {b.name: b for b in (KVRestore(), Breadcrumb(), Discard(), NoEviction())}


def backend(name: str) -> RecoveryBackend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown recovery backend {name!r}; valid: {', '.join(BACKENDS)}") from None
