"""A vocabulary-only copy of the model for counting tokens off the engine thread (the endpoint's size checks).

Invariants: it loads the GGUF with `vocab_only` (no weights, no context, milliseconds), so counting a large
request never waits behind a turn nor blocks one; it is independent of the engine's model, which an idle
unload may free at any time; one call at a time (a lock), since it serves any worker thread.
"""

from __future__ import annotations

import threading
from pathlib import Path

import llama_cpp as ll

from .runtime import _quiet_llama_logs, safe_model_params


class VocabCounter:
    def __init__(self, model_path: Path) -> None:
        self.model_path = Path(model_path)
        _quiet_llama_logs()
        params = safe_model_params()
        params.vocab_only = True
        self._model = ll.llama_model_load_from_file(str(self.model_path).encode(), params)
        if not self._model:
            raise ValueError(f"llama.cpp could not read the vocabulary of {self.model_path}")
        self._vocab = ll.llama_model_get_vocab(self._model)
        self._lock = threading.Lock()

    def count(self, text: str) -> int:
        """Tokens in `text` as user content (special-token markup in it is counted as plain text)."""
        data = text.encode("utf-8")
        with self._lock:
            if self._model is None:
                raise RuntimeError("the vocabulary was closed")
            n = ll.llama_tokenize(self._vocab, data, len(data), None, 0, False, False)
        return -n if n < 0 else n

    def close(self) -> None:
        with self._lock:
            if self._model is not None:
                ll.llama_model_free(self._model)
                self._model = None

    def __del__(self) -> None:
        self.close()
