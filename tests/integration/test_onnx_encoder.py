"""The embedder on ONNX Runtime (issue 44: a cold turn's message embedding): the bundled MiniLM exported from its own
weights gives sentence-transformers' vectors, a second start opens the export without torch's model, a damaged
export is made again, and where no export can be written the embedder stays on sentence-transformers."""

from __future__ import annotations

import numpy as np
import pytest

from evoke_engine.memory import onnx_encoder
from evoke_engine.memory.embedder import BACKEND_ENV, Embedder, SentenceTransformerEncoder, bundled_model_path

# Other wordings than the export's own probes: a padded batch of short and long, code, prose, a table row.
TEXTS = ["retry_limit: 9", "Which port does the staging proxy listen on?",
         "class Pool:\n    def acquire(self, timeout=3.0):\n        return self._free.pop()",
         "| region | eu-west-2 | 14 nodes |", "The build failed because the linker ran out of memory. " * 40]


@pytest.fixture(scope="module")
def reference():
    """sentence-transformers' own vectors for TEXTS, one text at a time."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(bundled_model_path(), device="cpu")
    return np.stack([model.encode([t], normalize_embeddings=True)[0] for t in TEXTS])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    cache = tmp_path_factory.mktemp("embedders")
    embedder = Embedder(cache_dir=cache)
    embedder.warm()
    return embedder, cache


def test_the_export_gives_sentence_transformers_vectors(exported, reference):
    embedder, cache = exported
    assert isinstance(embedder._load(), onnx_encoder.OnnxSentenceEncoder)
    assert list(cache.glob("*.onnx")) and embedder.dimension() == 384
    batched = embedder.embed(TEXTS)
    alone = np.stack([embedder.embed([t])[0] for t in TEXTS])
    assert np.abs(batched - reference).max() < 1e-5 and np.abs(alone - reference).max() < 1e-5
    assert np.allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-6)


def test_a_second_start_opens_the_export_without_sentence_transformers(exported, reference, monkeypatch):
    _, cache = exported

    def refuse(path):
        raise AssertionError("sentence-transformers loaded although the export was there")
    monkeypatch.setattr(Embedder, "_sentence_transformer", staticmethod(refuse))
    again = Embedder(cache_dir=cache)
    assert np.abs(again.embed(TEXTS) - reference).max() < 1e-5


def test_a_damaged_export_is_made_again(exported, reference, tmp_path):
    _, cache = exported
    copy = tmp_path / "embedders"
    copy.mkdir()
    for path in cache.glob("*.json"):
        (copy / path.name).write_bytes(path.read_bytes())
    for path in cache.glob("*.onnx"):
        (copy / path.name).write_bytes(path.read_bytes()[:4096])          # cut short: onnxruntime refuses it
    embedder = Embedder(cache_dir=copy)
    assert isinstance(embedder._load(), onnx_encoder.OnnxSentenceEncoder)
    assert np.abs(embedder.embed(TEXTS) - reference).max() < 1e-5
    assert all(path.stat().st_size > 1_000_000 for path in copy.glob("*.onnx"))


def test_an_unwritable_cache_keeps_sentence_transformers(tmp_path, reference):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would be")
    embedder = Embedder(cache_dir=blocked / "embedders")
    assert isinstance(embedder._load(), SentenceTransformerEncoder)
    assert np.abs(embedder.embed(TEXTS) - reference).max() < 1e-5


def test_the_backend_setting_keeps_sentence_transformers(tmp_path, monkeypatch):
    monkeypatch.setenv(BACKEND_ENV, "sentence-transformers")
    embedder = Embedder(cache_dir=tmp_path)
    assert isinstance(embedder._load(), SentenceTransformerEncoder) and not list(tmp_path.glob("*.onnx"))


def test_an_exported_embedder_starts_without_torch(exported):
    """The app's start: opening the export imports neither torch nor sentence-transformers."""
    import subprocess
    import sys

    _, cache = exported
    script = ("import sys; from evoke_engine.memory.embedder import Embedder; "
              f"e = Embedder(cache_dir={str(cache)!r}); e.warm(); "
              "print(type(e._load()).__name__, 'torch' in sys.modules, 'sentence_transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["OnnxSentenceEncoder", "False", "False"]


def test_loading_the_embedder_leaves_the_hub_online_for_model_downloads(tmp_path):
    """The embedder reads only the disk (`local_files_only`), not through HF_HUB_OFFLINE, which huggingface_hub
    reads once at its import: set by the embedder, it turned `evoke-desk pull` and the window's download off for
    the whole process (issue 60)."""
    import os
    import subprocess
    import sys

    script = ("from evoke_engine.memory.embedder import Embedder\n"
              f"e = Embedder(cache_dir={str(tmp_path)!r}); assert e.embed(['hello']).shape == (1, 384)\n"
              "import huggingface_hub.constants as c, os\n"
              "print(c.HF_HUB_OFFLINE, os.environ.get('HF_HUB_OFFLINE'))\n")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env[BACKEND_ENV] = "sentence-transformers"             # the path that loads through huggingface_hub
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "None"]
