"""`bench restore`: save + restore of a block against re-prefilling the same tokens, side by side.

Invariant: every figure comes from the same context in one run (median of `trials`); the
restore time includes re-anchoring and whatever K-shift cost the next decode pays. Each size is measured by the
direct path (`kv_direct`, where the cache has one) and by llama.cpp's serialised state, side by side, against a
plain memcpy of the same bytes (the CPU's limit, on every machine: hot, repeated between two buffers, and cold, after
the caches were swept, as a restore after a decode finds them) and, on a GPU, a pinned host-to-device copy.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from evoke_engine.runtime.kv import KVCache, SavedKV
from evoke_engine.runtime.runtime import Runtime
from evoke_engine.settings import Settings

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


def memcpy_ms(nbytes: int, trials: int = 7) -> float:
    """Median milliseconds of one plain copy of `nbytes` between two host buffers already paged in."""
    source = np.ones(nbytes, dtype=np.uint8)
    target = np.zeros(nbytes, dtype=np.uint8)
    np.copyto(target, source)
    times = []
    for _ in range(trials):
        start = time.perf_counter()
        np.copyto(target, source)
        times.append(_ms(start))
    return statistics.median(times)


_EVICT_BYTES = 96 << 20        # streamed through before a cold copy: more than a workstation CPU's last-level cache


def memcpy_cold_ms(nbytes: int, trials: int = 5) -> float:
    """Median milliseconds of the same copy with source and target out of the caches first (as a restore finds the
    pool's bytes and the cache's cells after a decode has streamed the weights through)."""
    source = np.ones(nbytes, dtype=np.uint8)
    target = np.zeros(nbytes, dtype=np.uint8)
    sweep = np.ones(_EVICT_BYTES, dtype=np.uint8)
    times = []
    for _ in range(trials):
        sweep += 1
        start = time.perf_counter()
        np.copyto(target, source)
        times.append(_ms(start))
    return statistics.median(times)


def _held_copy(kv: KVCache, saved: SavedKV) -> SavedKV:
    """A copy of `saved` in the memory the pool holds blocks in (the host arena: pinned on a GPU), as a restore
    from the pool reads it."""
    out = kv.arena.buffer(len(saved.data)) if kv.arena is not None else None
    if out is None:
        return SavedKV(bytearray(saved.data), saved.origin_pos, saved.n_tokens)
    out[:] = saved.data
    return SavedKV(out, saved.origin_pos, saved.n_tokens)


def _path_rows(rt: Runtime, kv: KVCache, tokens: list[int], n: int, trials: int, context_tokens: int) -> dict:
    """save, restore (re-anchored at a new position), llama.cpp-shift restore and re-prefill by kv's current path."""
    seq, probe = 0, 1
    block = tokens[context_tokens - n:context_tokens]          # the last n tokens of the context
    p0 = context_tokens - n
    rows: dict[str, list[float]] = {k: [] for k in ("save", "restore", "restore_call", "next_decode_extra",
                                                    "llama_shift_restore", "reprefill")}
    saved = None
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
        copy = _held_copy(kv, saved)
        start = time.perf_counter()
        kv.restore(copy, seq, at)
        rows["restore_call"].append(_ms(start))
        extra = max(0.0, _next_decode_ms(rt, kv, seq, probe) - baseline)
        rows["next_decode_extra"].append(extra)
        rows["restore"].append(rows["restore_call"][-1] + extra)
        # the same restore through llama.cpp's own K-shift (what the native rotation replaces)
        kv.drop(seq, at, -1)
        geometry, kv.geometry = kv.geometry, None
        copy = _held_copy(kv, saved)
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
    med["bytes"] = len(saved.data)
    return med


def measure(rt: Runtime, kv: KVCache, n: int, trials: int, context_tokens: int) -> dict:
    seq = 0
    kv.drop(seq)
    tokens = _document(rt, context_tokens + n)
    rt.decode(tokens[:context_tokens], seq, 0, logits_last=False)
    direct_on = kv.use_direct and kv._direct_for(rt.context_of(seq)) is not None
    kv.use_direct = False
    serial = _path_rows(rt, kv, tokens, n, trials, context_tokens)
    kv.use_direct = direct_on
    med = _path_rows(rt, kv, tokens, n, trials, context_tokens) if direct_on else serial
    nbytes = med["bytes"]
    memcpy = memcpy_ms(nbytes)
    memcpy_cold = memcpy_cold_ms(nbytes)
    pinned = h2d_copy_ms(nbytes) if rt.device.on_gpu else None
    gpu = {} if pinned is None else {
        "pinned_copy_ms": round(pinned, 3), "pinned_gbps": round(nbytes / pinned / 1e6, 2),
        "restore_vs_pinned": round(med["restore_call"] / pinned, 2),
        "restore_with_shift_vs_pinned": round(med["restore"] / pinned, 2)}
    return {"tokens": n, "bytes": nbytes, "path": "direct" if direct_on else "serialised",
            "save_ms": round(med["save"], 3),
            "restore_gbps": round(nbytes / med["restore_call"] / 1e6, 2),
            "memcpy_ms": round(memcpy, 3), "memcpy_gbps": round(nbytes / memcpy / 1e6, 2),
            "restore_vs_memcpy": round(med["restore_call"] / memcpy, 2),
            "save_vs_memcpy": round(med["save"] / memcpy, 2),
            "memcpy_cold_ms": round(memcpy_cold, 3),
            "restore_vs_cold_memcpy": round(med["restore_call"] / memcpy_cold, 2),
            "save_vs_cold_memcpy": round(med["save"] / memcpy_cold, 2), **gpu,
            "restore_ms": round(med["restore"], 3), "restore_call_ms": round(med["restore_call"], 3),
            "next_decode_extra_ms": round(med["next_decode_extra"], 3),
            "llama_shift_restore_ms": round(med["llama_shift_restore"], 3),
            "reprefill_ms": round(med["reprefill"], 2),
            "speedup": round(med["reprefill"] / (med["save"] + med["restore"]), 1),
            "speedup_with_llama_shift": round(med["reprefill"] / (med["save"] + med["llama_shift_restore"]), 1),
            "serialised": {"save_ms": round(serial["save"], 3), "restore_ms": round(serial["restore"], 3),
                           "restore_call_ms": round(serial["restore_call"], 3),
                           "llama_shift_restore_ms": round(serial["llama_shift_restore"], 3),
                           "restore_vs_memcpy": round(serial["restore_call"] / memcpy, 2),
                           "save_vs_memcpy": round(serial["save"] / memcpy, 2)}}


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
                "direct_path": not kv.direct_note, "direct_note": kv.direct_note,
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
        flash_attention: str = "auto", pool_bits: tuple[int, ...] = (), overrides: dict | None = None) -> dict:
    """`n_ctx` is raised where the largest size would not fit a slot's context.
    `rpc`: also measure the model split evenly across this machine and RPC workers (`auto`: two started on
    127.0.0.1), after the local model in the same run, with the split/local ratios per size. `pool_bits`: also
    the host pool at those bits on the same model (`bench pool`'s rows: RAM per saved token, take+splice time,
    logit difference against the 16-bit restore). `overrides`: further Settings fields (`--set KEY=VALUE`)."""
    largest = max(sizes)                # a context holds the document, a 16-token gap and the block again
    per_context = max(context_tokens, largest + 64) + 16 + largest + 64
    n_ctx = max(n_ctx, -(-2 * per_context // 256) * 256)
    # a context a slot: the serialised path is measured beside the direct one, and it moves a block through the
    # scratch sequence in the slot's own context (a KV stream per slot moves blocks by the direct path only)
    settings = Settings(model_path=model_path, n_ctx=n_ctx, slots=2, n_gpu_layers=n_gpu_layers,
                        flash_attention=flash_attention, slot_layout="contexts")
    if overrides:
        settings = settings.replace(**overrides)
    result = _run_one(settings, sizes, trials, context_tokens)
    if pool_bits:
        result["pool"] = _pool_rows(settings, pool_bits, trials)
    if not rpc:
        return result
    from evoke_engine.runtime.rpc_worker import bench_workers, even_split

    with bench_workers(rpc) as (endpoints,):
        split = _run_one(settings.replace(rpc_servers=endpoints, rpc_layer_split=even_split(endpoints)),
                         sizes, trials, context_tokens)
    keys = ("save_ms", "restore_ms", "restore_call_ms", "reprefill_ms")
    result["rpc"] = {"workers": rpc, "endpoints": endpoints, "devices": split["devices"], "rows": split["rows"],
                     "split_over_local": [{"tokens": local["tokens"],
                                           **{k: round(remote[k] / local[k], 2) if local[k] else None for k in keys}}
                                          for local, remote in zip(result["rows"], split["rows"], strict=True)]}
    return result
