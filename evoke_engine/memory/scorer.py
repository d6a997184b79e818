"""Block scores in [0, 1] from weighted signals: similarity, task focus, recency, the model's own
attention (when captured), floors, pins.

Invariants: pure functions of plain values (no llama.cpp, no embedder calls); a pinned block
scores 1.0; user and assistant blocks never score below their role floors; new settings reach a scorer and a
focus only through their `use_settings` (their owner's settings changed), never by assignment from outside.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kvcache.blocks import Block
from ..settings import Settings


@dataclass
class TaskFocus:
    """EMA of user-message vectors that snaps to a new message on a topic shift."""

    ema: float = 0.3
    snap_cosine: float = 0.3
    vector: np.ndarray | None = None
    snaps: int = 0

    def use_settings(self, settings: Settings) -> None:
        """The EMA weight and snap threshold of `settings` for every later update (the vector stays)."""
        self.ema, self.snap_cosine = settings.focus_ema, settings.focus_snap_cosine

    def update(self, message_vector: np.ndarray | None) -> None:
        if message_vector is None:
            return
        if self.vector is None or float(self.vector @ message_vector) < self.snap_cosine:
            self.vector = message_vector.copy()
            self.snaps += 1
            return
        mixed = (1 - self.ema) * self.vector + self.ema * message_vector
        self.vector = mixed / (np.linalg.norm(mixed) + 1e-12)


def cosine(a: np.ndarray | None, b: np.ndarray | None) -> float:
    if a is None or b is None:
        return 0.0
    return float(a @ b)


class Scorer:
    """Scores under the settings it was given last (`use_settings`: the owner's settings changed)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    def use_settings(self, settings: Settings) -> None:
        """Weights, floors and the recency half-life of `settings` for every later score."""
        self._settings = settings

    def recency(self, block: Block, current_turn: int) -> float:
        age = max(0, current_turn - block.turn)
        return 0.5 ** (age / self._settings.recency_half_life_turns)

    def score(self, block: Block, *, query: np.ndarray | None, focus: np.ndarray | None,
              current_turn: int, attention: float | None = None) -> float:
        """`attention`: the block's share of the model's attention (1 = the most attended block), or
        None when not captured (the signal then takes no part, and scores are as without it)."""
        if block.pinned:
            return 1.0
        s = self._settings
        signals = ((s.weight_similarity, max(0.0, cosine(block.embedding, query))),
                   (s.weight_focus, max(0.0, cosine(block.embedding, focus))),
                   (s.weight_recency, self.recency(block, current_turn)))
        if attention is not None:
            signals += ((s.weight_attention, min(1.0, max(0.0, attention))),)
        total_weight = sum(w for w, _ in signals) or 1.0
        raw = sum(w * v for w, v in signals) / total_weight
        value = min(block.priority * raw, 1.0)
        floor = {"user": s.user_floor, "assistant": s.assistant_floor}.get(block.role, 0.0)
        return max(value, floor)
