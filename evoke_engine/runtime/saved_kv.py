"""`SavedKV`: a block's K/V bytes out of the cache, where they are anchored and whether their copy is done.

Invariants: plain data (no llama.cpp here, so the simulator and the pool use it without loading llama.cpp); the bytes
are llama.cpp's serialised layout of a position range; `data` is complete once `wait` returns.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field


@dataclass
class SavedKV:
    """K/V bytes of a position range as llama.cpp serialises a sequence, and where they sit.

    `origin_pos` is the position the bytes are anchored at (updated when they are re-anchored). `pending`: the
    copy of the rows still under way on a worker (`KVCache.save_deferred`); `wait` before reading `data`.
    """

    data: bytearray | memoryview      # writable, so restore and re-anchoring need no copy
    origin_pos: int
    n_tokens: int
    pending: Future | None = field(default=None, compare=False, repr=False)

    def wait(self) -> None:
        """Return once `data` holds every byte (at once unless a deferred save is still copying)."""
        if self.pending is not None:
            self.pending.result()
            self.pending = None

    @property
    def nbytes(self) -> int:
        return len(self.data)
