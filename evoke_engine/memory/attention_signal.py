"""One conversation's attention per block, read from the runtime's `AttentionCapture`: a signal of the memory
policy (scoring and recovery tie-breaks), kept apart from the capture so the runtime needs no blocks.

Invariants: inert (every value unknown) without an active capture; shares are scaled so that the most attended
resident block scores 1; a block's last-known share outlives its residency (keyed by block name).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..kvcache.blocks import Block

if TYPE_CHECKING:
    from ..runtime.attention import AttentionCapture


class AttentionSignal:
    """One conversation's attention per block: current for resident blocks, last known for saved ones."""

    def __init__(self, capture: AttentionCapture | None) -> None:
        self.capture = capture if capture is not None and capture.active else None
        self.current: dict[Block, float] = {}     # block -> share, resident blocks at the last refresh
        self.last_known: dict[str, float] = {}    # block name -> share when it was last resident

    @property
    def enabled(self) -> bool:
        return self.capture is not None

    def refresh(self, seq: int | None, resident: Iterable[Block], aggregation: str) -> None:
        """Read the decaying masses of `seq` and reduce them to its non-shared resident blocks,
        scaled so that the most attended block scores 1."""
        self.current = {}
        if self.capture is None or seq is None:
            return
        view = self.capture.view(seq)
        mass = view.mass_adakv if aggregation == "adakv" else view.mass_mean
        blocks = [b for b in resident if not b.shared and b.pos is not None]
        sums = {b: float(mass[b.pos:b.end].sum()) for b in blocks}
        top = max(sums.values(), default=0.0)
        if top <= 0.0:
            return
        for block in blocks:
            share = sums[block] / top
            self.current[block] = share
            self.last_known[block.name] = share

    def value(self, block: Block) -> float | None:
        """The share of a resident block at the last refresh (None when unknown)."""
        return self.current.get(block)

    def last(self, block: Block) -> float:
        """Last-known share of a block (0.0 if never measured): a tie-breaker for recovery."""
        return self.last_known.get(block.name, 0.0)
