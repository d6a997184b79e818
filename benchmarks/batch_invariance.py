"""`bench batch-invariance`: is a decoding token's logits row, bit for bit, the one it gets alone when k prompt tokens
of another sequence share its `llama_decode`? In each slot layout (one unified cache; a KV stream a sequence).

Invariants: raw llama.cpp on the embedded model, one context per layout, the same prompt and cells for the token
alone and batched (the other sequence's cells removed between cases); flash attention as the engine's CPU default
(on); no timing, so a busy machine changes nothing. It answers why the unified layout's greedy replies are not
promised alone-equal (docs/benchmarks.md, issue 59): a ubatch of that many rows takes another kernel.
"""

from __future__ import annotations

import llama_cpp as ll
import numpy as np

from evoke_engine.runtime.model_file import default_model_path

PROMPT = "The quick brown fox jumps over the lazy dog while the farmer watches from the old barn."
OTHER = " ".join(f"line {i} says port {8000 + i} restarts nightly" for i in range(80))
TOKEN = 42


class Probe:
    def __init__(self, model, unified: bool, threads: int, *, sequences: int = 2, cells_each: int = 2048,
                 flash_attention: int = 1) -> None:
        params = ll.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = cells_each * sequences, 512, 512, sequences
        params.n_threads = params.n_threads_batch = threads
        params.kv_unified, params.flash_attn_type = unified, flash_attention
        self.ctx = ll.llama_init_from_model(model, params)
        self.n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))

    def decode(self, items: list[tuple[int, int, int, bool]]) -> None:
        """items: (token, position, sequence, wants logits)."""
        batch = ll.llama_batch_init(len(items), 0, 2)
        try:
            for i, (token, pos, seq, logits) in enumerate(items):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, pos, 1, logits
                batch.seq_id[i][0] = seq
            batch.n_tokens = len(items)
            if ll.llama_decode(self.ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
        finally:
            ll.llama_batch_free(batch)

    def first_row(self) -> np.ndarray:
        return np.ctypeslib.as_array(ll.llama_get_logits_ith(self.ctx, 0), shape=(self.n_vocab,)).copy()

    def token_row(self, prompt: list[int], other: list[int]) -> np.ndarray:
        """The token's row after `prompt` (sequence 0), decoded in one batch with `other`'s tokens (sequence 1)."""
        memory = ll.llama_get_memory(self.ctx)
        ll.llama_memory_seq_rm(memory, 0, len(prompt), -1)
        ll.llama_memory_seq_rm(memory, 1, -1, -1)
        self.decode([(TOKEN, len(prompt), 0, True)] + [(t, j, 1, False) for j, t in enumerate(other)])
        return self.first_row()

    def close(self) -> None:
        ll.llama_free(self.ctx)


def _tokens(vocab, text: str) -> list[int]:
    data = text.encode()
    buf = (ll.llama_token * 4096)()
    return list(buf[:ll.llama_tokenize(vocab, data, len(data), buf, 4096, True, False)])


def run(*, threads: int, rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 62, 63, 64, 128, 256)) -> dict:
    ll.llama_backend_init()
    model = ll.llama_model_load_from_file(str(default_model_path()).encode(), ll.llama_model_default_params())
    vocab = ll.llama_model_get_vocab(model)
    prompt, other = _tokens(vocab, PROMPT), _tokens(vocab, OTHER)
    out: dict = {"token_rows_in_the_ubatch": {}, "threads": threads}
    try:
        for layout, unified in (("unified", True), ("streams", False)):
            probe = Probe(model, unified, threads)
            try:
                probe.decode([(t, i, 0, False) for i, t in enumerate(prompt)])
                alone = probe.token_row(prompt, [])
                figures = {}
                for n in rows:
                    batched = probe.token_row(prompt, other[:n - 1])
                    figures[str(n)] = {"equal": bool(np.array_equal(alone, batched)),
                                       "max_abs_difference": float(np.abs(alone - batched).max())}
                out["token_rows_in_the_ubatch"][layout] = figures
            finally:
                probe.close()
    finally:
        ll.llama_model_free(model)
    return out
