"""A sentence-transformers model of the usual shape (a BERT-style encoder, mean pooling, unit length) run with ONNX
Runtime: exported once per model from its own weights, checked against sentence-transformers, kept in a cache.

Invariants: an exported model is used only after it gave the vectors sentence-transformers gives (max |diff| <=
MATCH_TOLERANCE on probe texts: a padded batch, code, a text past the model's length); its file is named by the
model folder's content (a changed model is exported again) and written whole (a temporary name, then a rename)
under a file lock; any failure (onnx or onnxruntime missing, another pipeline, an unwritable cache, a damaged
file) makes `load` give no encoder, with the reason logged, and the caller keeps sentence-transformers; an
export opened or made removes those of older formats (`prune_older_formats`). Loading an exported model imports
neither torch nor sentence-transformers.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

log = logging.getLogger(__name__)
MATCH_TOLERANCE = 1e-4         # per component of a unit vector: float32 noise is ~1e-7, a wrong graph is ~1e-1
FORMAT = 3                     # bump when what `export` writes changes: older files are exported again
MAX_THREADS = 4                # a short message gains nothing past this; llama.cpp keeps the other cores
PROBES = ["fn main() { let pool_size = 71; }", "Where is the retry budget set?",
          "def flush(self):\n    \"\"\"Write the queue.\"\"\"\n    return self._queue.drain(timeout=2.5)",
          "ünïcödé → ok", "", " ".join(f"word{i}" for i in range(400))]


def fingerprint(model_dir: str | Path) -> str:
    """A name for the model folder's content: every file's relative path and bytes (xxh3, ~10 GB/s)."""
    import xxhash

    root = Path(model_dir)
    digest = xxhash.xxh3_128()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        with path.open("rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
    return f"{FORMAT}-{digest.hexdigest()}"


class OnnxSentenceEncoder:
    """`encode(texts)`: (len(texts), dimension) float32 unit vectors, batch by batch, as sentence-transformers
    would give them for this model; its idle threads sleep (`spins` False), so it may run beside other work."""

    spins = False

    def __init__(self, onnx_path: Path, tokenizer_path: Path, max_length: int, dimension: int,
                 pad_id: int = 0, pad_token: str = "[PAD]") -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        options = ort.SessionOptions()
        options.intra_op_num_threads = max(1, min(MAX_THREADS, os.cpu_count() or 1))
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")   # idle threads leave the cores
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))       # the model's fast tokenizer, as saved
        self.tokenizer.enable_truncation(max_length)
        self.tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token)     # to the batch's longest
        self.max_length = max_length
        self.dimension = dimension

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            batch = texts[start:start + batch_size]
            out[start:start + len(batch)] = self.run(self.feed(batch))
        return out

    def feed(self, texts: list[str]) -> dict[str, np.ndarray]:
        """One batch's model inputs: the tokenizer's ids, padded to the batch's longest (the interpreter's work of
        an embedding: `Embedder.embed_soon` does it on the caller's thread, so its own thread never waits for
        the GIL while the caller's Python runs)."""
        batch = self.tokenizer.encode_batch(texts)
        return {"input_ids": np.array([e.ids for e in batch], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in batch], dtype=np.int64),
                "token_type_ids": np.array([e.type_ids for e in batch], dtype=np.int64)}

    def run(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        """The batch's unit vectors: the graph (which runs without the GIL), then mean pooling and unit length."""
        hidden = self.session.run(None, {name: feed[name] for name in self.inputs})[0]
        mask = feed["attention_mask"].astype(np.float32)[:, :, None]
        pooled = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


class _Files(NamedTuple):
    """One model's export in the cache: its graph, its tokenizer and its record (written last: whole when there)."""

    graph: Path
    tokenizer: Path
    record: Path

    @classmethod
    def of(cls, model_dir: str | Path, cache_dir: Path) -> _Files:
        name = fingerprint(model_dir)
        return cls(cache_dir / f"{name}.onnx", cache_dir / f"{name}.tokenizer.json", cache_dir / f"{name}.json")

    def encoder(self, record: dict) -> OnnxSentenceEncoder:
        return OnnxSentenceEncoder(self.graph, self.tokenizer, int(record["max_length"]), int(record["dimension"]),
                                   int(record["pad_id"]), str(record["pad_token"]))


def load(model_dir: str | Path, cache_dir: str | Path,
         sentence_transformer: Callable[[str | Path], Any]) -> tuple[OnnxSentenceEncoder | None, Any]:
    """The model's checked export from `cache_dir`, made now when there is none from the model that
    `sentence_transformer(model_dir)` loads: (the encoder, the loaded model or None), or (None, the loaded model)
    when it cannot run here (the reason logged; the caller keeps sentence-transformers)."""
    cache = Path(cache_dir)
    files = _Files.of(model_dir, cache)
    if (ready := _open(files, model_dir)) is not None:
        prune_older_formats(cache)
        return ready, None
    model = sentence_transformer(model_dir)
    if (made := _export(model, model_dir, cache, files)) is not None:
        prune_older_formats(cache)
    return made, model


def exported(model_dir: str | Path, cache_dir: str | Path) -> bool:
    """Whether `cache_dir` holds an export of the model in `model_dir` (a load then takes a second, where the
    export itself takes from a few seconds to a minute and needs torch)."""
    return _Files.of(model_dir, Path(cache_dir)).record.exists()


def _open(files: _Files, model_dir: str | Path) -> OnnxSentenceEncoder | None:
    """The export in `files`, or None when there is none (or it cannot be opened)."""
    try:
        return files.encoder(json.loads(files.record.read_text())) if files.record.exists() else None
    except Exception as exc:                       # a damaged file or record, a missing runtime: not used
        log.warning("embedder: the ONNX export of %s (%s) is not usable (%s); exporting it again",
                    model_dir, files.graph, exc)
        return None


def supported(model) -> bool:
    """True for a sentence-transformers model this module runs alike: encoder, mean pooling, normalize."""
    names = [type(module).__name__ for module in model]
    if names != ["Transformer", "Pooling", "Normalize"]:
        return False
    pooling = model[1].get_config_dict()
    mean = pooling.get("pooling_mode") == "mean" or pooling.get("pooling_mode_mean_tokens") is True
    return mean and pooling.get("include_prompt", True) is not False


def dimension_of(model) -> int:
    """A loaded SentenceTransformer's vector length (the method's name changed across its versions)."""
    size = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return int(size() or model.encode(["dimension"]).shape[1])


def _export(model, model_dir: str | Path, cache: Path, files: _Files) -> OnnxSentenceEncoder | None:
    """Export `model` (a loaded SentenceTransformer from `model_dir`) into `files`, check it against the model
    itself, and return it; None (reason logged) when it is not this shape or the export or the check fails."""
    if not supported(model) or not getattr(model.tokenizer, "is_fast", False):
        log.info("embedder: %s is not an encoder with mean pooling and a fast tokenizer; kept on "
                 "sentence-transformers", model_dir)
        return None
    try:
        from filelock import FileLock

        cache.mkdir(parents=True, exist_ok=True)
        with FileLock(str(files.graph) + ".lock", timeout=120):
            if (ready := _open(files, model_dir)) is not None:         # another process exported it meanwhile
                return ready
            files.record.unlink(missing_ok=True)                        # whatever is there is not whole
            _write_graph(model, files.graph)
            model.tokenizer.backend_tokenizer.save(str(files.tokenizer))
            record = {"max_length": int(model.max_seq_length), "dimension": dimension_of(model),
                      "model": str(model_dir), "pad_id": int(model.tokenizer.pad_token_id or 0),
                      "pad_token": str(model.tokenizer.pad_token)}
            encoder = files.encoder(record)
            record["max_difference"] = diff = _max_difference(model, encoder)
            if diff > MATCH_TOLERANCE:
                log.warning("embedder: the ONNX export of %s differs by %.2e; kept on sentence-transformers",
                            model_dir, diff)
                return None
            _write_whole(files.record, json.dumps(record).encode())
            log.info("embedder: %s exported to ONNX (max difference %.1e)", model_dir, diff)
            return encoder
    except Exception as exc:                       # onnx missing, a read-only cache, an unexportable graph
        log.warning("embedder: no ONNX export of %s (%s); kept on sentence-transformers", model_dir, exc)
        return None


def prune_older_formats(cache: Path) -> list[str]:
    """Remove the files of exports an older `FORMAT` wrote (this code never opens them again; ~90 MB each); the
    names removed. A file another process holds open where that forbids it (Windows) stays, for the next export."""
    removed: list[str] = []
    try:
        paths = sorted(cache.iterdir())
    except OSError:
        return removed
    for path in paths:
        version, sep, _ = path.name.partition("-")
        if sep and version.isdigit() and int(version) < FORMAT:
            try:
                path.unlink()
                removed.append(path.name)
            except OSError as exc:
                log.info("embedder: an old export %s stays (%s)", path, exc)
    if removed:
        log.info("embedder: removed %d files of older exports from %s", len(removed), cache)
    return removed


def _write_graph(model, onnx_path: Path) -> None:
    """The encoder's last hidden state as an ONNX graph over the tokenizer's inputs (batch and length dynamic)."""
    import torch

    encoder = model[0].auto_model.eval()
    names = [n for n in model.tokenizer.model_input_names if n in ("input_ids", "attention_mask", "token_type_ids")]
    sample = model.tokenizer(["an example"], return_tensors="pt")

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, *inputs):
            return self.encoder(**dict(zip(names, inputs, strict=True))).last_hidden_state

    fd, tmp = tempfile.mkstemp(dir=onnx_path.parent, suffix=".part")
    os.close(fd)
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")              # the tracer's notes; the check after it is what counts
            torch.onnx.export(Hidden(), tuple(sample[n] for n in names), tmp, input_names=names,
                              output_names=["hidden"], dynamic_axes={n: {0: "batch", 1: "tokens"}
                                                                     for n in [*names, "hidden"]},
                              opset_version=17, dynamo=False)
        os.chmod(tmp, 0o644)
        os.replace(tmp, onnx_path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _write_whole(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _max_difference(model, candidate: OnnxSentenceEncoder) -> float:
    """Largest component difference between the two on the probes, one at a time and as one padded batch."""
    expected = model.encode(PROBES, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False)
    alone = np.stack([candidate.encode([text])[0] for text in PROBES])
    batched = candidate.encode(PROBES)
    return float(max(np.abs(expected - alone).max(), np.abs(expected - batched).max()))
