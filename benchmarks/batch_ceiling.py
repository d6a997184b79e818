"""`bench batch-ceiling`: what N clients at once can gain over one on this machine with llama.cpp alone (issue 59):
one client's prompt prefilled and its reply decoded a token a call, against N prompts prefilled in one call and their
replies decoded N tokens a call; no server, no sampler, no Python between the calls but the batch's filling.

Invariants: raw llama.cpp on the embedded model (or `model_path`), one context a layout with N + 1 sequences (the KV
streams layout and the unified cache), each sequence's cached head decoded untimed first (the shared system prompt
every request reuses), the same tokens for every layout; times are medians of `trials`; the ratio is aggregate
tokens/s at N over one, the zero-overhead bound on `bench concurrency`'s "clients" ratio for prompts that long.
"""

from __future__ import annotations

import statistics
import time

import llama_cpp as ll

from evoke_engine.runtime.model_file import default_model_path

from .batch_invariance import OTHER, Probe, _tokens


def _trial(probe: Probe, tokens: list[int], clients: int, head: int, prompt: int, reply: int) -> tuple[float, float]:
    """(seconds to every first token, seconds to every reply's end) for `clients` at once."""
    ll.llama_memory_clear(ll.llama_get_memory(probe.ctx), True)
    for seq in range(clients):
        probe.decode([(t, j, seq, False) for j, t in enumerate(tokens[:head])])
    began = time.perf_counter()
    probe.decode([(tokens[head + j + seq], head + j, seq, j == prompt - 1)
                  for seq in range(clients) for j in range(prompt)])
    first = time.perf_counter() - began
    for pos in range(head + prompt, head + prompt + reply - 1):
        probe.decode([(tokens[(pos + seq) % len(tokens)], pos, seq, True) for seq in range(clients)])
    return first, time.perf_counter() - began


def run(*, threads: int, clients: int = 4, head: int = 51, prompt: int = 31, reply: int = 64, trials: int = 3,
        model_path: str | None = None) -> dict:
    ll.llama_backend_init()
    model = ll.llama_model_load_from_file(str(model_path or default_model_path()).encode(),
                                          ll.llama_model_default_params())
    try:
        tokens = _tokens(ll.llama_model_get_vocab(model), OTHER)
        out: dict = {"clients": clients, "cached_head_tokens": head, "prompt_tokens": prompt,
                     "reply_tokens": reply, "trials": trials, "threads": threads}
        for layout, unified in (("streams", False), ("unified", True)):
            probe = Probe(model, unified, threads, sequences=clients + 1, cells_each=4096,
                          flash_attention=0)                         # the engine's CPU default with an f16 cache
            try:
                figures = {}
                for n in (1, clients):
                    runs = [_trial(probe, tokens, n, head, prompt, reply) for _ in range(trials)]
                    total = statistics.median(r[1] for r in runs)
                    figures[n] = {"first_tokens_s": round(statistics.median(r[0] for r in runs), 3),
                                  "total_s": round(total, 3), "tokens_per_s": round(n * reply / total, 1)}
                out[layout] = {"one": figures[1], "at_once": figures[clients],
                               "ratio": round(figures[clients]["tokens_per_s"] / figures[1]["tokens_per_s"], 2)}
            finally:
                probe.close()
        return out
    finally:
        ll.llama_model_free(model)
