"""A stand-in embedder for the memory's logic without a model: hashed bag-of-words unit vectors.

Invariants: the same text gives the same vector in every process (crc32 of its words); `texts` records every text
embedded, in order, so a test can say what a decision or a turn end embedded.
"""

from __future__ import annotations

import re
import zlib

import numpy as np


class CountingEmbedder:
    """Hashed bag-of-words unit vectors (no model: the embedder is not llama.cpp); records every text embedded."""

    enabled = True
    identity = "words"
    warming = False

    def __init__(self, dims: int = 64) -> None:
        self.texts: list[str] = []
        self.dims = dims

    def _vector(self, text: str) -> np.ndarray:
        v = np.zeros(self.dims, dtype=np.float32)
        for word in re.findall(r"[a-z0-9]+", text.lower()):
            v[zlib.crc32(word.encode()) % self.dims] += 1.0
        return v / (np.linalg.norm(v) or 1.0)

    def embed(self, texts):
        self.texts.extend(texts)
        return np.stack([self._vector(t) for t in texts]) if texts else None

    def embed_one(self, text):
        return self.embed([text])[0]
