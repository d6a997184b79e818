"""The stats snapshot of a conversation kept current while its reply streams (engine thread).

Invariant: wrapped around a turn's token callback, it forwards every piece unchanged and refreshes the
conversation's `latest_stats` snapshot at most once per `interval_s`, so a window polling it during a reply sees
the KV grow (a snapshot costs one pass over the block table, never a llama.cpp call).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .lifecycle import ConversationLifecycle, ConversationState

LIVE_STATS_INTERVAL_S = 0.25


class StatsTicker:
    """A token callback that forwards to `forward` and refreshes the stats snapshot at a bounded rate."""

    def __init__(self, lifecycle: ConversationLifecycle, state: ConversationState,
                 forward: Callable[[str], None] | None, *, interval_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lifecycle, self.state, self.forward = lifecycle, state, forward
        self.interval_s = LIVE_STATS_INTERVAL_S if interval_s is None else interval_s
        self.clock = clock
        self.refreshes = 0
        self._at = clock()

    def __call__(self, piece: str) -> None:
        if self.forward is not None:
            self.forward(piece)
        now = self.clock()
        if now - self._at >= self.interval_s:
            self._at = now
            self.lifecycle.refresh(self.state)
            self.refreshes += 1
