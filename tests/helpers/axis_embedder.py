"""An embedder whose every message is the first axis, and block vectors at a chosen cosine with it: a block's
similarity to any message is what a test sets (recovery tests on plain objects)."""

from __future__ import annotations

import numpy as np

AXES = 8


class AxisEmbedder:
    """Every message embeds to the first axis: a block's cosine with a message is what the test sets."""

    enabled = True
    identity = "axis"

    def embed(self, texts):
        return np.stack([self.embed_one(t) for t in texts]) if texts else None

    def embed_one(self, text):
        v = np.zeros(AXES, dtype=np.float32)
        v[0] = 1.0
        return v


def at_cosine(cosine: float) -> np.ndarray:
    """A unit vector at `cosine` with every message's."""
    v = np.zeros(AXES, dtype=np.float32)
    v[0], v[1] = cosine, float(np.sqrt(max(0.0, 1 - cosine * cosine)))
    return v
