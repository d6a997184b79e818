"""A vocabulary-only copy of the model for counting and tokenizing off the engine thread (the endpoint's size checks,
a raw completion's prompt and its fill-in-the-middle layout, /tokenize and /detokenize).

Invariants: it loads the GGUF with `vocab_only` (no weights, no context, milliseconds), so counting a large
request never waits behind a turn nor blocks one; it is independent of the engine's model, which an idle
unload may free at any time; one call at a time (a lock), since it serves any worker thread.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import llama_cpp as ll

from .runtime import quiet_llama_logs, safe_model_params
from .tokens import tokenize_with


class VocabCounter:
    def __init__(self, model_path: Path) -> None:
        self.model_path = Path(model_path)
        quiet_llama_logs()
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

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """`text`'s tokens as the engine's model tokenizes it (`Runtime.tokenize`), BOS first when `add_special`
        and the model wants it."""
        with self._lock:
            if self._model is None:
                raise RuntimeError("the vocabulary was closed")
            return tokenize_with(self._vocab, text, add_special, parse_special)

    @property
    def n_tokens(self) -> int:
        return ll.llama_vocab_n_tokens(self._vocab)

    def piece(self, token: int) -> bytes:
        """The bytes `token` stands for, a special token as its text (llama-server's /tokenize pieces)."""
        with self._lock:
            if self._model is None:
                raise RuntimeError("the vocabulary was closed")
            buf = ctypes.create_string_buffer(64)
            n = ll.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = ll.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
            return buf.raw[:max(n, 0)]

    def detokenize(self, tokens: list[int]) -> str:
        """The text of `tokens` (ids in 0..n_tokens-1), special tokens as their text, invalid UTF-8 replaced."""
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def infill(self, prefix: str, suffix: str) -> list[int] | None:
        """Fill-in-the-middle tokens in llama-server's layout: [BOS] FIM_PRE prefix FIM_SUF suffix FIM_MID, the
        texts as plain text; None when the model has no FIM tokens (it was not trained to fill in)."""
        vocab = self._vocab
        pre, suf, mid = ll.llama_vocab_fim_pre(vocab), ll.llama_vocab_fim_suf(vocab), ll.llama_vocab_fim_mid(vocab)
        bos = ll.llama_vocab_bos(vocab) if ll.llama_vocab_get_add_bos(vocab) else -1
        return infill_layout(pre, suf, mid, bos, self.tokenize(prefix, add_special=False, parse_special=False),
                             self.tokenize(suffix, add_special=False, parse_special=False))

    def close(self) -> None:
        with self._lock:
            if self._model is not None:
                ll.llama_model_free(self._model)
                self._model = None

    def __del__(self) -> None:
        self.close()


def infill_layout(pre: int, suf: int, mid: int, bos: int, prefix: list[int], suffix: list[int]) -> list[int] | None:
    """[BOS] PRE prefix SUF suffix MID (bos < 0: none); None when any FIM token is missing (< 0)."""
    if min(pre, suf, mid) < 0:
        return None
    return [*([bos] if bos >= 0 else []), pre, *prefix, suf, *suffix, mid]
