"""`bench reuse`: a second conversation attaching the same ~2K-token file, its blocks spliced from the first
conversation's K/V (chunk index, exact: same system prompt) against decoding them, side by side in one run.

Invariants: one engine; the first conversation holds the file in its slot for the whole run; each trial opens a
fresh conversation with the same system prompt and the same attachment, with `chunk_reuse` on and off in turn
(the setting applies now), and releases it after; `ttft_s` is the turn's time to first token (`Reply.ttft_s`);
the greedy continuation (temperature 0) of the probe question is compared token by token between on and off.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import tempfile

from .. import Engine, Settings
from .paste import paste_text

log = logging.getLogger(__name__)

PROBE = "In one sentence, what does the first function in the file do?"


def file_of_tokens(engine: Engine, tokens: int, seed: int = 0) -> str:
    """A generated source file (code kind) of about `tokens` tokens."""
    size = tokens * 3
    while True:
        text = paste_text(seed * 4, size)
        n = len(engine.tokenize(text, special=False))
        if n >= tokens:
            return text
        size = int(size * tokens / max(n, 1)) + 64


def _share_equal(a: list[int], b: list[int], n: int) -> float:
    """The share of the first `n` greedy tokens equal position by position (a missing token counts unequal)."""
    return sum(1 for i in range(n) if i < len(a) and i < len(b) and a[i] == b[i]) / n


def run(*, file_tokens: int = 2000, trials: int = 5, max_tokens: int = 32, threads: int = 0) -> dict:
    with tempfile.TemporaryDirectory(prefix="evoke-reuse-") as home:
        settings = Settings(home=home, temperature=0.0, n_threads=threads, n_ctx=32768, slots=4,
                            budget_tokens=6144, embedder="off")
        with Engine(settings, scheduler=False) as engine:
            attachment = [("service.py", file_of_tokens(engine, file_tokens))]
            first = engine.new_conversation()
            first.submit("Here is the file I work on today.", attachment, max_tokens=8).result()
            decoded = first.stats().prefill_tokens
            rows: dict[bool, list[dict]] = {True: [], False: []}
            texts: dict[bool, list[str]] = {True: [], False: []}
            for trial in range(trials):
                for reuse in ((True, False) if trial % 2 == 0 else (False, True)):
                    engine.apply_settings(dataclasses.replace(engine.settings, chunk_reuse=reuse))
                    second = engine.new_conversation()
                    reply = second.submit(PROBE, attachment, max_tokens=max_tokens).result()
                    stats = second.stats()
                    rows[reuse].append({"ttft_s": round(reply.ttft_s, 4), "reused_tokens": reply.reused_tokens,
                                        "decoded_tokens": stats.prefill_tokens})
                    texts[reuse].append(reply.text)
                    engine.release_conversation(second.id, persist=False)
                    log.info("trial %d reuse %s: ttft %.3f s, reused %d", trial, reuse, reply.ttft_s,
                             reply.reused_tokens)
            on, off = (engine.tokenize(texts[r][0], special=False) for r in (True, False))
    med = {r: {k: statistics.median(row[k] for row in rows[r]) for k in rows[r][0]} for r in (True, False)}
    return {"bench": "reuse", "file_tokens": file_tokens, "first_conversation_decoded": decoded,
            "trials": trials, "max_tokens": max_tokens,
            "exact": {"reuse_on": med[True], "reuse_off": med[False],
                      "ttft_speedup": round(med[False]["ttft_s"] / med[True]["ttft_s"], 1),
                      "greedy_identical": all(t == texts[False][0] for t in (*texts[True], *texts[False])),
                      "greedy_token_share": _share_equal(on, off, max_tokens),
                      "reply_on": texts[True][0], "reply_off": texts[False][0]},
            "raw": {"reuse_on": rows[True], "reuse_off": rows[False]}}
