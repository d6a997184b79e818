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


class _Gated:
    """An encoder that waits for `gate` and counts its calls (the embedder's model, for `embed_soon`: `feed` on the
    caller's thread, `run` on its own)."""

    spins = False

    def __init__(self) -> None:
        import threading

        self.gate = threading.Event()
        self.calls: list[list[str]] = []

    def feed(self, texts):                  # the interpreter's part, on the caller's thread
        return list(texts)

    def run(self, feed):                    # the graph's part, on the embedder's own thread
        self.gate.wait(5)
        self.calls.append(feed)
        return np.asarray([[float(len(t)), 1.0] for t in feed], dtype=np.float32)

    def encode(self, texts, batch_size=32):
        return self.run(self.feed(texts))


def _loaded(model) -> Embedder:
    made = Embedder("gated")
    made._model = model
    return made


def test_a_text_started_soon_is_embedded_once_and_waited_for():
    model = _Gated()
    embedder = _loaded(model)
    embedder.embed_soon("why does the flush wait?")
    embedder.embed_soon("why does the flush wait?")              # already on its way: not started again
    model.gate.set()
    vector = embedder.embed_one("why does the flush wait?")
    assert model.calls == [["why does the flush wait?"]] and vector.tolist() == [24.0, 1.0]
    assert embedder.embed_one("why does the flush wait?") is vector      # kept like any recent text


def test_soon_starts_nothing_before_the_model_is_loaded():
    embedder = Embedder("not loaded")
    embedder.embed_soon("anything")                       # a load would block the engine: never started here
    assert embedder._soon == {}


def test_soon_starts_nothing_on_an_encoder_whose_threads_spin():
    model = _Gated()
    model.spins = True                                    # torch: beside the turn's Python it slows both
    embedder = _loaded(model)
    embedder.embed_soon("anything")
    assert embedder._soon == {}


def test_texts_started_but_never_asked_for_are_forgotten():
    model = _Gated()
    model.gate.set()
    embedder = _loaded(model)
    for i in range(RECENT_TEXTS + 3):
        embedder.embed_soon(f"draft {i}")
    assert len(embedder._soon) == RECENT_TEXTS and "draft 0" not in embedder._soon


def test_a_draft_waits_for_the_one_still_embedding_but_a_sent_message_never_does():
    """Typed fast, a long draft is embedded one version at a time (`unless_busy`: the next pause starts the newest);
    a message sent (no `unless_busy`) starts at once whatever is running."""
    model = _Gated()
    embedder = _loaded(model)
    embedder.embed_soon("draft one", unless_busy=True)
    embedder.embed_soon("draft one and", unless_busy=True)      # the first is still running: skipped
    embedder.embed_soon("draft one and two")                    # Enter: started beside it
    assert list(embedder._soon) == ["draft one", "draft one and two"]
    model.gate.set()
    embedder.embed_one("draft one")
    embedder.embed_one("draft one and two")
    embedder.embed_soon("draft one and two, three", unless_busy=True)    # nothing runs now: started
    assert "draft one and two, three" in embedder._soon
