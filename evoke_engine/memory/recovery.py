"""Recovery backends as strategies: what an eviction keeps of a block, and how a needed block comes back.

Invariants: one stateless, pure strategy per name of `Settings.recovery` (`BACKENDS`, the same names as
`settings.RECOVERY_BACKENDS`): it reads blocks and answers, never calls into memory (`ConversationMemory` acts
on its answers through its resident sequence); `backend(name)` lists the valid names for a wrong one.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..kvcache.blocks import Block, BlockState


class RecoveryBackend:
    """What eviction keeps and what recovery brings back; the defaults keep and bring back nothing."""

    name = ""
    evicts = True               # False: the conversation grows to the context (no eviction at all)
    keeps_bytes = False         # True: victims' K/V go to the pool before they leave the context
    brings_back = ""            # "bytes": splice the saved K/V back; "marker": decode a marker of the text

    def candidates(self, blocks: Sequence[Block]) -> list[Block]:
        """Of a conversation's `blocks` (birth order), those out of the context this backend could bring back."""
        return []


class Discard(RecoveryBackend):
    """Evicted blocks are dropped and nothing comes back."""

    name = "discard"


class KVRestore(RecoveryBackend):
    """Victims' K/V bytes are kept (RAM, then disk) and spliced back with a RoPE re-anchor: no forward pass."""

    name = "kv_restore"
    keeps_bytes = True
    brings_back = "bytes"

    def candidates(self, blocks: Sequence[Block]) -> list[Block]:
        return [b for b in blocks if b.state in (BlockState.RAM, BlockState.DISK)]


class Breadcrumb(RecoveryBackend):
    """Victims are dropped; a needed one comes back as a short decoded marker of its text."""

    name = "breadcrumb"
    brings_back = "marker"

    def candidates(self, blocks: Sequence[Block]) -> list[Block]:
        marked = {b.name.removeprefix("breadcrumb:") for b in blocks
                  if b.role == "breadcrumb" and b.state is BlockState.RESIDENT}
        return [b for b in blocks if b.state is BlockState.DROPPED and b.role != "breadcrumb"
                and b.name not in marked]        # dropped blocks whose marker is not in the context now

    @staticmethod
    def marker(block: Block) -> str:
        """The text decoded in place of `block`: its name and first words."""
        words = block.text.split()
        return f"[earlier {block.name}: {' '.join(words[:16])}{' …' if len(words) > 16 else ''}]\n"


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
