"""An embedder that cannot load in this install (no usable ONNX export, no sentence-transformers: a bundle whose
user cache lost its export) degrades to recall by words, said once, instead of failing turns (issue 62's finding).

Invariants: `embed` gives no vectors and `dimension` None, `warming` holds for good, the background load reports the
reason, and nothing raises to the caller."""

from __future__ import annotations

import threading

from evoke_engine.memory import embedder as embedder_module
from evoke_engine.memory.embedder import Embedder


def _no_torch(_path):
    raise ImportError("No module named 'sentence_transformers'")


def test_an_embedder_without_export_or_torch_gives_no_vectors_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(Embedder, "_sentence_transformer", staticmethod(_no_torch))
    embedder = Embedder(cache_dir=tmp_path / "empty-cache")
    assert embedder.embed(["the harbour wall"]) is None
    assert "cannot run here" in embedder.unavailable and "sentence_transformers" in embedder.unavailable
    assert embedder.warming and embedder.dimension() is None and embedder.embed_one("a line") is None


def test_its_background_load_reports_the_reason_once(tmp_path, monkeypatch):
    monkeypatch.setattr(Embedder, "_sentence_transformer", staticmethod(_no_torch))
    embedder = Embedder(cache_dir=tmp_path / "empty-cache")
    said, done = [], threading.Event()
    embedder.warm_in_background(lambda _first_use: None, lambda seconds, error: (said.append(error), done.set()))
    assert done.wait(120) and isinstance(said[0], embedder_module.EmbedderUnavailable)
    assert embedder.wait_warm(1) and embedder.embed(["x"]) is None
