"""`bench paste`: where the first token of a long paste goes under a small budget (decoding, embedding for the
eviction choice, everything else), against the same paste with no eviction (the floor), in one run.

Invariants: every paste is a fresh conversation on one engine per budget; the pastes are generated from a seed
in several kinds (code, logs, YAML, prose) so no one text is measured; time in llama.cpp's decode and in the
embedder is summed by wrapping those two calls on the instances the engine uses, so `other` is what is neither;
`ttft_s` is the wall time from submit to the first (only) token.
"""

from __future__ import annotations

import logging
import random
import statistics
import tempfile
import time
from collections.abc import Callable

from evoke_engine import Engine, Settings

log = logging.getLogger(__name__)


def paste_text(seed: int, target_bytes: int) -> str:
    """A paste of about `target_bytes` in one of four kinds, chosen and filled from `seed`."""
    rng = random.Random(seed)
    kind = ("code", "log", "yaml", "prose")[seed % 4]
    words = ["cache", "retry", "socket", "parser", "ledger", "window", "thread", "budget", "token", "shard"]
    lines: list[str] = []
    while sum(len(line) + 1 for line in lines) < target_bytes:
        i, w = len(lines), rng.choice(words)
        if kind == "code":
            lines += [f"def {w}_{i}(request, retries={rng.randint(1, 9)}):",
                      f"    # {w} step {i}: hand the request on",
                      f"    return dispatch(request, '{w}/{i}', timeout={rng.randint(1, 90)})", ""]
        elif kind == "log":
            lines.append(f"2026-11-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} "
                         f"{rng.choice(['INFO', 'WARN', 'ERROR'])} {w}[{rng.randint(100, 999)}]: "
                         f"{rng.choice(['took', 'failed after', 'retried in'])} {rng.randint(1, 5000)} ms")
        elif kind == "yaml":
            lines += [f"{w}_{i}:", f"  enabled: {rng.choice(['true', 'false'])}",
                      f"  limit: {rng.randint(1, 10000)}", f"  owner: team-{rng.choice(words)}"]
        else:
            lines.append(f"The {w} layer handles case {i}; when it {rng.choice(['stalls', 'fails', 'grows'])}, "
                         f"the {rng.choice(words)} keeps {rng.randint(2, 64)} entries until the next sweep.")
    return "\n".join(lines)


def _timed(fn: Callable, bucket: list[float]) -> Callable:
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            bucket[0] += time.perf_counter() - t0
    return wrapper


def run(*, budgets: tuple[int, ...] = (768,), kb: float = 7.0, trials: int = 4, threads: int = 0) -> dict:
    rows = []
    for budget in (*budgets, 0):
        floor = budget == 0
        with tempfile.TemporaryDirectory(prefix="evoke-paste-") as home:
            settings = Settings(home=home, budget_tokens=budget or 8192, recovery="none" if floor else "kv_restore",
                                temperature=0.0, n_threads=threads, n_ctx=16384, slots=2)
            with Engine(settings, scheduler=False) as engine:
                decode_s, embed_s = [0.0], [0.0]
                engine.diagnostics().rt.decode = _timed(engine.diagnostics().rt.decode, decode_s)
                engine.diagnostics().embedder.embed = _timed(engine.diagnostics().embedder.embed, embed_s)
                warm = engine.new_conversation()
                warm.send("Say hi.", max_tokens=2)                         # the embedder and caches are loaded
                trials_out = []
                for trial in range(trials):
                    decode_s[0] = embed_s[0] = 0.0
                    conv = engine.new_conversation()
                    text = paste_text(trial, int(kb * 1024))
                    started = time.perf_counter()
                    reply = conv.submit(f"Here is what I have:\n{text}\n\nWhat is the first line about?",
                                        max_tokens=1).result()
                    wall = time.perf_counter() - started
                    stats = conv.stats()
                    trials_out.append({"kind": ("code", "log", "yaml", "prose")[trial % 4],
                                       "tokens": reply.prefill_tokens, "ttft_s": wall,
                                       "decode_s": decode_s[0], "embed_s": embed_s[0],
                                       "other_s": max(0.0, wall - decode_s[0] - embed_s[0]),
                                       "evictions": stats.evictions, "active": stats.active_tokens})
                    log.info("budget %s trial %d: %.2f s", budget or "none", trial, reply.ttft_s)
        med = {k: round(statistics.median(t[k] for t in trials_out), 3)
               for k in ("ttft_s", "decode_s", "embed_s", "other_s", "tokens", "evictions")}
        rows.append({"budget": budget or None, "eviction": not floor, **med, "trials": trials_out})
    floor_ttft = rows[-1]["ttft_s"]
    for row in rows[:-1]:
        row["ttft_over_floor"] = round(row["ttft_s"] / floor_ttft, 2) if floor_ttft else None
    return {"bench": "paste", "kb": kb, "rows": rows}
