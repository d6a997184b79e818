"""`bench restore`: save + restore of a block against re-prefilling the same tokens, side by side.

Invariant: every figure comes from the same context in one run (median of `trials`); the
restore time includes re-anchoring and whatever K-shift cost the next decode pays.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

from ..runtime.kv import KVCache, SavedKV
from ..runtime.runtime import Runtime
from ..settings import Settings
from .pinned_copy import h2d_copy_ms

SIZES = (32, 128, 512, 1024)


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


def _document(rt: Runtime, n_tokens: int) -> list[int]:
    text = "\n".join(f"Section {i}: the service reads its configuration, validates field {i}, "
                     f"and logs the value {i * 37 % 1000} before continuing." for i in range(400))
    tokens = rt.tokenize(text)
    if len(tokens) < n_tokens:
        raise ValueError(f"the bench document has {len(tokens)} tokens, fewer than the {n_tokens} asked for")
    return tokens[:n_tokens]


def _next_decode_ms(rt: Runtime, kv: KVCache, seq: int, token: int) -> float:
    """Time one token decoded at the tail, then remove it again."""
    pos = kv.pos_max(seq) + 1
    start = time.perf_counter()
    rt.decode([token], seq, pos)
    elapsed = _ms(start)
    kv.drop(seq, pos, -1)
    return elapsed


def measure(rt: Runtime, kv: KVCache, n: int, trials: int, context_tokens: int) -> dict:
    seq, probe = 0, 1
    kv.drop(seq)
    tokens = _document(rt, context_tokens + n)
    rt.decode(tokens[:context_tokens], seq, 0, logits_last=False)
    block = tokens[context_tokens - n:context_tokens]          # the last n tokens of the context
    p0 = context_tokens - n
    rows: dict[str, list[float]] = {k: [] for k in ("save", "restore", "restore_call", "next_decode_extra",
                                                    "llama_shift_restore", "reprefill")}
    for _ in range(trials):
        baseline = statistics.median(_next_decode_ms(rt, kv, seq, probe) for _ in range(3))
        start = time.perf_counter()
        saved = kv.save(seq, p0, p0 + n)
        rows["save"].append(_ms(start))
        kv.evict(seq, p0, p0 + n)
        kv.flush_pending_shifts()
        # re-anchored restore at a new position: the tail after a 16-token gap of other text
        gap = tokens[context_tokens:context_tokens + 16]
        rt.decode(gap, seq, kv.pos_max(seq) + 1, logits_last=False)
        at = kv.pos_max(seq) + 1
        copy = SavedKV(bytearray(saved.data), saved.origin_pos, saved.n_tokens)
        start = time.perf_counter()
        kv.restore(copy, seq, at)
        rows["restore_call"].append(_ms(start))
        extra = max(0.0, _next_decode_ms(rt, kv, seq, probe) - baseline)
        rows["next_decode_extra"].append(extra)
        rows["restore"].append(rows["restore_call"][-1] + extra)
        # the same restore through llama.cpp's own K-shift (what the native rotation replaces)
        kv.drop(seq, at, -1)
        geometry, kv.geometry = kv.geometry, None
        copy = SavedKV(bytearray(saved.data), saved.origin_pos, saved.n_tokens)
        start = time.perf_counter()
        kv.restore(copy, seq, at)
        call = _ms(start)
        kv.geometry = geometry
        rows["llama_shift_restore"].append(call + max(0.0, _next_decode_ms(rt, kv, seq, probe) - baseline))
        kv.drop(seq, at, -1)
        # re-prefill: decode the same tokens at the same tail position
        start = time.perf_counter()
        rt.decode(block, seq, at)
        rows["reprefill"].append(_ms(start))
        kv.drop(seq, at - len(gap), -1)
        rt.decode(block, seq, at - len(gap), logits_last=False)    # back to the original layout
        kv.flush_pending_shifts()
    med = {k: statistics.median(v) for k, v in rows.items()}
    pinned = h2d_copy_ms(len(saved.data)) if rt.device.on_gpu else None
    gpu = {} if pinned is None else {
        "pinned_copy_ms": round(pinned, 3), "pinned_gbps": round(len(saved.data) / pinned / 1e6, 2),
        "restore_vs_pinned": round(med["restore_call"] / pinned, 2)}
    return {"tokens": n, "bytes": len(saved.data), "save_ms": round(med["save"], 3),
            "restore_gbps": round(len(saved.data) / med["restore_call"] / 1e6, 2), **gpu,
            "restore_ms": round(med["restore"], 3), "restore_call_ms": round(med["restore_call"], 3),
            "next_decode_extra_ms": round(med["next_decode_extra"], 3),
            "llama_shift_restore_ms": round(med["llama_shift_restore"], 3),
            "reprefill_ms": round(med["reprefill"], 2),
            "speedup": round(med["reprefill"] / (med["save"] + med["restore"]), 1),
            "speedup_with_llama_shift": round(med["reprefill"] / (med["save"] + med["llama_shift_restore"]), 1)}


def _run_one(settings: Settings, sizes: tuple[int, ...], trials: int, context_tokens: int) -> dict:
    rt = Runtime(settings)
    try:
        kv = KVCache(rt)
        rows = [measure(rt, kv, n, trials, max(context_tokens, n + 64)) for n in sizes]
        info = rt.info()
        return {"bench": "restore", "model": info.name, "model_desc": info.description, "device": info.device,
                "n_ctx": rt.n_ctx, "kv_cache_type": settings.kv_cache_type, "flash_attention": rt.flash_attention,
                "trials": trials,
                "native_reanchor": kv.geometry is not None, "reanchor_note": kv.reanchor_note,
                "devices": [d.as_dict() for d in info.devices], "rows": rows}
    finally:
        rt.close()


def _pool_rows(settings: Settings, bits: tuple[int, ...], trials: int) -> dict:
    from . import pool

    home = Path(tempfile.mkdtemp(prefix="bench-restore-pool-"))
    rt = Runtime(settings)
    try:
        return pool.measure(rt, KVCache(rt), home, bits=bits, trials=max(trials, 5))
    finally:
        rt.close()
        shutil.rmtree(home, ignore_errors=True)


def run(sizes: tuple[int, ...] = SIZES, trials: int = 5, n_ctx: int = 4096, model_path: str | None = None,
        context_tokens: int = 1536, n_gpu_layers: int = -1, rpc: str | None = None,
        flash_attention: str = "auto", pool_bits: tuple[int, ...] = ()) -> dict:
    """`rpc`: also measure the model split evenly across this machine and RPC workers (`auto`: two started on
    127.0.0.1), after the local model in the same run, with the split/local ratios per size. `pool_bits`: also
    the host pool at those bits on the same model (`bench pool`'s rows: RAM per saved token, take+splice time,
    logit difference against the 16-bit restore)."""
    settings = Settings(model_path=model_path, n_ctx=n_ctx, slots=2, n_gpu_layers=n_gpu_layers,
                        flash_attention=flash_attention)
    result = _run_one(settings, sizes, trials, context_tokens)
    if pool_bits:
        result["pool"] = _pool_rows(settings, pool_bits, trials)
    if not rpc:
        return result
    from ..runtime.rpc_worker import bench_workers, even_split

    with bench_workers(rpc) as (endpoints,):
        split = _run_one(settings.replace(rpc_servers=endpoints, rpc_layer_split=even_split(endpoints)),
                         sizes, trials, context_tokens)
    keys = ("save_ms", "restore_ms", "restore_call_ms", "reprefill_ms")
    result["rpc"] = {"workers": rpc, "endpoints": endpoints, "devices": split["devices"], "rows": split["rows"],
                     "split_over_local": [{"tokens": local["tokens"],
                                           **{k: round(remote[k] / local[k], 2) if local[k] else None for k in keys}}
                                          for local, remote in zip(result["rows"], split["rows"], strict=True)]}
    return result
