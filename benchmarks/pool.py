"""`bench pool` (and `bench restore --pool-bits`): the host pool at 16, 8 and 4 bits side by side: bytes per evicted
token, pack/unpack and take+splice time per 128-token block, and what a block evicted, held and spliced back does
to the next logits and greedy tokens.

Invariant: both arms run on the same context, documents and blocks in one run; quality is measured against
the same conversation never evicted (round trip at the block's own position, so only the storage differs).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from evoke_engine.kvcache import kvquant
from evoke_engine.kvcache.blocks import Block
from evoke_engine.kvcache.pool import SavedPool
from evoke_engine.runtime.kv import KVCache
from evoke_engine.runtime.runtime import Runtime
from evoke_engine.settings import Settings

BLOCK_TOKENS = 128
GREEDY_TOKENS = 8


def passkey_document(seed: int) -> tuple[str, str]:
    """A chat prompt with a passkey among filler lines (more lines before it as `seed` grows), and the key."""
    key = str(1000 + (seed * 7919) % 9000)
    before = " ".join(f"Line {i}: the pump in room {i} runs quietly." for i in range(10 + 3 * seed))
    after = " ".join(f"Line {i}: the fan in hall {i} is clean." for i in range(40, 70))
    text = (f"<|im_start|>user\n{before} The passkey is {key}. {after}\nWhat is the passkey?<|im_end|>\n"
            "<|im_start|>assistant\nThe passkey is")
    return text, key


def _greedy(rt: Runtime, kv: KVCache, seq: int, n: int) -> list[int]:
    out = []
    for _ in range(n):
        token = int(np.argmax(rt.logits()))
        out.append(token)
        rt.decode([token], seq, kv.pos_max(seq) + 1)
    return out


def splice_round_trip(rt: Runtime, kv: KVCache, pool: SavedPool, tokens: list[int], p0: int,
                      p1: int) -> tuple[np.ndarray, list[int], int, float]:
    """Decode all but the last token, evict [p0, p1) into `pool`, take it back and splice it in place, decode the
    last token: (its logits, the greedy continuation, the bytes the pool held for the block, the ms the take and
    the splice took)."""
    seq = 0
    kv.drop(seq)
    rt.decode(tokens[:-1], seq, 0, logits_last=False)
    block = Block(name="needle", role="file", turn=1, tokens=tokens[p0:p1], text="")
    pool.put(block, kv.save(seq, p0, p1))
    held = pool.nbytes(block)
    kv.evict(seq, p0, p1, compact=False)
    start = time.perf_counter()
    kv.restore(pool.take(block), seq, p0)
    restore_ms = _ms(start)
    rt.decode(tokens[-1:], seq, len(tokens) - 1)
    logits = rt.logits().copy()
    return logits, _greedy(rt, kv, seq, GREEDY_TOKENS), held, restore_ms


def _reference(rt: Runtime, kv: KVCache, tokens: list[int]) -> tuple[np.ndarray, list[int]]:
    kv.drop(0)
    rt.decode(tokens, 0, 0)
    logits = rt.logits().copy()
    return logits, _greedy(rt, kv, 0, GREEDY_TOKENS)


def _needle_block(rt: Runtime, tokens: list[int], key: str) -> tuple[int, int]:
    """A BLOCK_TOKENS block with the passkey sentence in its middle, inside the document."""
    marker = rt.tokenize(f" The passkey is {key}.")
    start = next(i for i in range(len(tokens)) if tokens[i:i + len(marker)] == marker)
    p0 = max(1, min(start - BLOCK_TOKENS // 2, len(tokens) - BLOCK_TOKENS - 16))
    return p0, p0 + BLOCK_TOKENS


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


def _agreement(a: list[int], b: list[int]) -> int:
    return sum(x == y for x, y in zip(a, b, strict=True))


def measure(rt: Runtime, kv: KVCache, home: Path, *, bits: tuple[int, ...] = (16, 8, 4), docs: int = 6,
            trials: int = 9) -> dict:
    """Every `bits` arm on the same documents and blocks of `rt`, side by side (16 is always measured: the
    packed arms are compared with its restore)."""
    bits = tuple(sorted(set(bits) | {16}, reverse=True))
    pools = {b: SavedPool(1 << 34, home / f"spill-{b}", bits=b) for b in bits}
    try:
        arms: dict[int, dict] = {b: {"bytes": 0, "tokens": 0, "max_vs_never": 0.0, "argmax_same": 0,
                                     "greedy_same_tokens": 0, "greedy_same_runs": 0, "passkey_found": 0,
                                     "max_vs_16": 0.0, "mean_vs_16": [], "greedy_vs_16": 0, "restore_ms": []}
                                 for b in bits}
        reference_found = 0
        blob = b""
        for seed in range(docs):
            text, key = passkey_document(seed)
            tokens = rt.tokenize(text)
            p0, p1 = _needle_block(rt, tokens, key)
            ref_logits, ref_greedy = _reference(rt, kv, tokens)
            reference_found += key in rt.detokenize(ref_greedy).replace(" ", "")
            runs = {b: splice_round_trip(rt, kv, pool, tokens, p0, p1) for b, pool in pools.items()}
            for b, (logits, greedy, held, restore_ms) in runs.items():
                arm = arms[b]
                arm["bytes"] += held
                arm["tokens"] += p1 - p0
                arm["restore_ms"].append(restore_ms)
                arm["max_vs_never"] = max(arm["max_vs_never"], float(np.abs(logits - ref_logits).max()))
                arm["argmax_same"] += int(np.argmax(logits) == np.argmax(ref_logits))
                arm["greedy_same_tokens"] += _agreement(greedy, ref_greedy)
                arm["greedy_same_runs"] += greedy == ref_greedy
                arm["passkey_found"] += key in rt.detokenize(greedy).replace(" ", "")
                delta = np.abs(logits - runs[16][0])
                arm["max_vs_16"] = max(arm["max_vs_16"], float(delta.max()))
                arm["mean_vs_16"].append(float(delta.mean()))
                arm["greedy_vs_16"] += _agreement(greedy, runs[16][1])
            if seed == 0:
                kv.drop(0)
                rt.decode(tokens, 0, 0, logits_last=False)
                blob = bytes(kv.save(0, p0, p1).data)
        result_arms = {}
        for b, arm in arms.items():
            row = {
                "bytes_per_evicted_token": round(arm["bytes"] / arm["tokens"], 1),
                "ram_vs_16_bit": round(arm["bytes"] / arms[16]["bytes"], 4),
                "take_and_splice_ms": round(statistics.median(arm["restore_ms"]), 3),
                "max_abs_logit_delta_vs_never_evicted": round(arm["max_vs_never"], 4),
                "argmax_same": f"{arm['argmax_same']}/{docs}",
                "greedy_token_agreement": round(arm["greedy_same_tokens"] / (docs * GREEDY_TOKENS), 4),
                "greedy_runs_identical": f"{arm['greedy_same_runs']}/{docs}",
                "passkey_found": f"{arm['passkey_found']}/{docs}",
            }
            if b != 16:
                pack_ms, unpack_ms = [], []
                for _ in range(trials):
                    start = time.perf_counter()
                    packed = kvquant.pack(blob, b)
                    pack_ms.append(_ms(start))
                    start = time.perf_counter()
                    kvquant.unpack(packed)
                    unpack_ms.append(_ms(start))
                row |= {"max_abs_logit_delta_vs_16_bit_restore": round(arm["max_vs_16"], 4),
                        "mean_abs_logit_delta_vs_16_bit_restore": round(statistics.fmean(arm["mean_vs_16"]), 5),
                        "greedy_token_agreement_vs_16_bit": round(arm["greedy_vs_16"] / (docs * GREEDY_TOKENS), 4),
                        "pack_ms_per_block": round(statistics.median(pack_ms), 3),
                        "unpack_ms_per_block": round(statistics.median(unpack_ms), 3)}
            result_arms[f"{b}_bit"] = row
        return {"kv_cache_type": "f16", "flash_attention": rt.flash_attention, "block_tokens": BLOCK_TOKENS,
                "docs": docs, "greedy_tokens": GREEDY_TOKENS, "trials": trials,
                "reference_passkey_found": f"{reference_found}/{docs}", "arms": result_arms,
                "note": "quality: the block holding the passkey evicted, held by the pool, spliced back at its own "
                        "position; compared with the same conversation never evicted (16-bit differs from it "
                        "only when llama.cpp places the cells elsewhere) and each packed arm with the 16-bit "
                        "restore; take_and_splice_ms: the pool's take (unpacking included) and the splice"}
    finally:
        for pool in pools.values():
            pool.close()


def run(*, docs: int = 6, trials: int = 9, n_ctx: int = 4096, model_path: str | None = None,
        bits: tuple[int, ...] = (16, 8, 4)) -> dict:
    home = Path(tempfile.mkdtemp(prefix="bench-pool-"))
    rt = Runtime(Settings(n_ctx=n_ctx, slots=2, home=str(home), model_path=model_path))
    try:
        result = measure(rt, KVCache(rt), home, bits=bits, docs=docs, trials=trials)
        return {"bench": "pool", "model": rt.model_path.name if hasattr(rt.model_path, "name")
                else str(rt.model_path), **result}
    finally:
        rt.close()
