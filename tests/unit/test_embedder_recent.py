"""The embedder keeps the last single texts' vectors (issue 44: a message embedded while it was typed costs its turn
no embedding): a kept text is embedded once, the oldest leaves past RECENT_TEXTS, and a kept vector is read-only."""

from __future__ import annotations

import numpy as np
import pytest

from evoke_engine.memory.embedder import RECENT_TEXTS, Embedder


@pytest.fixture
def embedder(monkeypatch):
    made = Embedder("counting")
    made.calls = []

    def embed(texts):
        made.calls.append(list(texts))
        return np.asarray([[float(len(t)), 1.0] for t in texts], dtype=np.float32)
    monkeypatch.setattr(made, "embed", embed)
    return made


def test_a_kept_text_is_embedded_once(embedder):
    first = embedder.embed_one("when is the cache flushed?")
    again = embedder.embed_one("when is the cache flushed?")
    assert embedder.calls == [["when is the cache flushed?"]] and again is first
    with pytest.raises(ValueError):
        first[0] = 0.0                    # shared with every later caller


def test_the_oldest_text_leaves_past_the_limit(embedder):
    for i in range(RECENT_TEXTS + 1):
        embedder.embed_one(f"text {i}")
    embedder.embed_one(f"text {RECENT_TEXTS}")             # the newest: kept
    embedder.embed_one("text 0")                           # the oldest: gone, embedded again
    assert len(embedder.calls) == RECENT_TEXTS + 2 and embedder.calls[-1] == ["text 0"]


def test_off_keeps_nothing():
    assert Embedder("off").embed_one("anything") is None
