"""Decode speed with the attention capture on one layer against no capture, side by side in one run.

Two contexts of the same model (one with the `cb_eval` capture, one without) decode the same prompt
and the same greedy continuation, interleaved round by round so machine load hits both arms alike.
Wall-clock and process CPU time are both reported: on a loaded machine wall time mostly measures the
other jobs, while CPU time (with one thread, no spinning workers) measures the work each arm does.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from evoke_engine.runtime.attention import AttentionCapture
from evoke_engine.runtime.kv import KVCache
from evoke_engine.runtime.runtime import Runtime
from evoke_engine.settings import Settings

TEXT = " ".join(f"Record {i}: the sensor in bay {i} reported {i * 17 % 101} units at noon." for i in range(400))


def _arm(capture: AttentionCapture | None, layers: str, settings: Settings) -> tuple[Runtime, KVCache]:
    rt = Runtime(settings, eval_callback=capture)
    if capture is not None:
        note = capture.attach(rt, layers=layers, scored_seqs=[0])
        if note:
            raise RuntimeError(note)
    return rt, KVCache(rt, mirror=capture)


def _round(rt: Runtime, kv: KVCache, prompt: list[int], tokens: int) -> tuple[float, float, float, float]:
    """(prompt tokens/s, generated tokens/s) by wall clock, then both by process CPU time."""
    kv.drop(0)
    start, cpu = time.perf_counter(), time.process_time()
    rt.decode(prompt, 0, 0)
    prefill, prefill_cpu = time.perf_counter() - start, time.process_time() - cpu
    pos = len(prompt)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(tokens):
        token = int(np.argmax(rt.logits()))
        rt.decode([token], 0, pos)
        pos += 1
    generate, generate_cpu = time.perf_counter() - start, time.process_time() - cpu
    return len(prompt) / prefill, tokens / generate, len(prompt) / prefill_cpu, tokens / generate_cpu


def run(*, context: int = 1024, tokens: int = 64, rounds: int = 5, layers: str = "", gqa: str = "mean",
        flash_attention: str = "auto", threads: int = 0) -> dict:
    settings = Settings(n_ctx=max(2048, context + tokens + 64), slots=1, flash_attention=flash_attention,
                        n_threads=threads)
    capture = AttentionCapture.create(gqa=gqa)
    if capture is None:
        raise RuntimeError("the attention capture library is not built (native/build.sh)")
    on_rt, on_kv = _arm(capture, layers, settings)
    off_rt, off_kv = _arm(None, layers, settings)
    prompt = on_rt.tokenize(TEXT)[:context]
    samples: dict[str, list[tuple[float, float, float, float]]] = {"off": [], "on": []}
    try:
        _round(on_rt, on_kv, prompt[:64], 4)                     # warm both arms
        _round(off_rt, off_kv, prompt[:64], 4)
        for i in range(rounds):
            order = (("off", off_rt, off_kv), ("on", on_rt, on_kv))
            for name, rt, kv in (order if i % 2 == 0 else order[::-1]):
                samples[name].append(_round(rt, kv, prompt, tokens))
        scored = capture.lib.evoke_attn_queries_scored(capture.handle)
    finally:
        on_rt.close()
        off_rt.close()
        capture.close()

    def arm(name: str) -> dict:
        cols = list(zip(*samples[name], strict=True))
        return {"prefill_tok_s_median": round(statistics.median(cols[0]), 1),
                "decode_tok_s_median": round(statistics.median(cols[1]), 2),
                "decode_tok_s_all": [round(g, 2) for g in cols[1]],
                "prefill_tok_per_cpu_s_median": round(statistics.median(cols[2]), 1),
                "decode_tok_per_cpu_s_median": round(statistics.median(cols[3]), 2),
                "decode_tok_per_cpu_s_all": [round(g, 2) for g in cols[3]]}

    def overhead(key: str) -> float:
        return round((1 - on[key] / off[key]) * 100, 1)

    off, on = arm("off"), arm("on")
    return {"bench": "attention", "context_tokens": len(prompt), "generated_tokens": tokens, "rounds": rounds,
            "layers": capture.layers, "gqa": gqa, "flash_attention": flash_attention, "threads": threads,
            "queries_scored": int(scored), "capture_off": off, "capture_on": on,
            "decode_overhead_pct_wall": overhead("decode_tok_s_median"),
            "decode_overhead_pct_cpu": overhead("decode_tok_per_cpu_s_median"),
            "prefill_overhead_pct_wall": overhead("prefill_tok_s_median"),
            "prefill_overhead_pct_cpu": overhead("prefill_tok_per_cpu_s_median")}
