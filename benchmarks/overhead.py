"""`bench overhead`: the engine's own time per turn outside llama.cpp calls (p50, p95) in a conversation of 50 and
300 blocks, and its share of the first token, read from each reply's breakdown (`conversations.breakdown`).

Invariants: one engine per block count (the embedded model, the configured embedder, `kv_restore`), its conversation
built from one attached document cut into that many blocks under a budget that holds a fraction of them (so every
turn's recovery decision ranks them all); the warm-up turns are never timed; every timed turn is a new short
question with a short greedy reply; the figures are the breakdown's, nothing re-measured here but the floor: after
each turn sent cold, with the engine idle, the same message is embedded again alone by the engine's embedder
(`message_embedding_alone_s`: no overlap, no contention; the least a cold turn's own embedding of its message costs
on this machine). Outside llama.cpp = the recovery decision + embedding the message + the engine's Python (the
remainder); the llama.cpp phases carry their thin Python wrappers (see breakdown.py), so it is a lower bound of the
engine's share; the work after the reply (`turn_end_s`) is reported apart, in neither. With `typed_ahead`, a turn in
each cycle has its message handed to `Engine.prepare_ahead` during the pause before it (as the window does when
typing pauses: the input rendered, the recovery decided and brought back where it fits) and those turns are reported
apart (`typed_ahead`), side by side with the others in the same conversation. With `embedded_ahead`, a turn in each
cycle has only its message's vector started (`Engine.embed_draft`) `ENTER_AFTER_S` before Enter, as the window does
at a short pause in typing (an Enter that comes before the draft settles), reported apart (`embedded_ahead`); with
both, the turns cycle through the three kinds. With `history`, that many short exchanges (a question, a 4-token
reply) come after the document and before the warm-up: the timed turns then follow a day's worth of messages, as a
long conversation's do (what grows with the history, not the blocks, shows there).
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time

from evoke_engine.engine import Engine
from evoke_engine.settings import Settings

from .conversations import PAUSE_S, SHORT, SYSTEM, document

log = logging.getLogger(__name__)
BLOCK_TOKENS = 32              # small blocks: 300 of them is a ~10K-token document, quick to prefill
WARM_TURNS = 2
TOKENS_PER_HINT = 0.55         # `conversations.document`'s size hint over the tokens it gives (the embedded model)
ENTER_AFTER_S = 0.09           # an embedded-ahead turn's Enter after its vector started (a keystroke's interval, less
                               # the window's `DRAFT_EMBED_MS`)


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))], 6)


def _summary(values: list[float]) -> dict:
    return {"p50": _percentile(values, 0.5), "p95": _percentile(values, 0.95), "n": len(values)}


def _figures(rows: list[dict]) -> dict:
    first = [r["first_token"] for r in rows]
    share = [f["outside_llama_s"] / f["total_s"] for f in first if f["total_s"] > 0]
    return {"turns": len(rows),
            "outside_llama_s": _summary([r["outside_llama_s"] for r in rows]),
            "outside_llama_to_first_token_s": _summary([f["outside_llama_s"] for f in first]),
            "python_s": _summary([r["python_s"] for r in rows]),
            "turn_end_s": _summary([r["turn_end_s"] for r in rows]),
            "decide_s": _summary([r["decide_s"] for r in rows]),
            "embed_s": _summary([r["embed_s"] for r in rows]),
            "restore_s": _summary([r["restore_s"] for r in rows]),
            "first_token_s": _summary([f["total_s"] for f in first]),
            "share_of_first_token": {"p50": round(statistics.median(share), 4) if share else None,
                                     "p95": _percentile(share, 0.95)},
            "bar_outside_llama_p50_le_2ms": None if not rows else
            _percentile([r["outside_llama_s"] for r in rows], 0.5) <= 0.002}


def _embedding_alone(engine: Engine, embedder, message: str) -> float:
    """`message` embedded again by `embedder` (not its kept vector: `embed`, the tokenizer and the graph) once the
    engine is idle (the pause lets the idle embedding of the turn's blocks run first): its seconds."""
    time.sleep(PAUSE_S)
    engine.wait_idle()
    started = time.perf_counter()
    embedder.embed([message])
    return time.perf_counter() - started


def _one_count(n_blocks: int, turns: int, threads: int, max_tokens: int, typed_ahead: bool = False,
               history: int = 0, embedded_ahead: bool = False) -> dict:
    budget = max(1024, n_blocks * BLOCK_TOKENS // 4)
    settings = Settings(home=tempfile.mkdtemp(prefix="evoke-overhead-"), budget_tokens=budget, n_ctx=4 * budget,
                        slots=1, n_threads=threads, recovery="kv_restore", block_tokens=BLOCK_TOKENS,
                        system_prompt=SYSTEM, tools_enabled=False)
    with Engine(settings, scheduler=False) as engine:
        engine.wait_idle()                                          # the embedder warmed: no turn waits for it
        conv = engine.new_conversation(system_prompt=SYSTEM, tools=[])
        doc = document("svc", int(n_blocks * BLOCK_TOKENS * TOKENS_PER_HINT))
        conv.send("Read this file and reply OK.", [("svc.txt", doc)], max_tokens=2, temperature=0)
        for i in range(history):                                    # never timed
            conv.send(f"Note {i}: {SHORT[i % len(SHORT)]}", max_tokens=4, temperature=0)
        blocks = [b for b in conv.stats().blocks if not b.get("shared")]
        modes = ["cold", *(["typed_ahead"] if typed_ahead else []), *(["embedded_ahead"] if embedded_ahead else [])]
        timed: dict[str, list[dict]] = {mode: [] for mode in modes}
        alone: list[float] = []
        embedder = engine.diagnostics().embedder
        for turn in range(WARM_TURNS + turns):
            time.sleep(PAUSE_S)
            message = f"{SHORT[turn % len(SHORT)]} (question {turn})"
            mode = modes[turn % len(modes)]
            if mode == "typed_ahead":
                engine.prepare_ahead(conv.id, message, max_tokens=max_tokens).result()   # typing paused
            elif mode == "embedded_ahead":
                engine.embed_draft(message)           # the window, a short pause after the last keystroke
                time.sleep(ENTER_AFTER_S)
            reply = conv.submit(message, max_tokens=max_tokens, temperature=0).result()
            if turn >= WARM_TURNS and reply.breakdown.get("first_token"):
                timed[mode].append(reply.breakdown)
                if mode == "cold":
                    alone.append(_embedding_alone(engine, embedder, message))
        stats = conv.stats()
    log.info("overhead at %d blocks: %d turns", len(blocks), sum(map(len, timed.values())))
    return {"blocks_asked": n_blocks, "blocks": len(blocks), "messages_before": 2 + 2 * history,
            "saved_blocks": sum(b.get("state") != "resident" for b in stats.blocks),
            "budget_tokens": budget, **_figures(timed["cold"]), "message_embedding_alone_s": _summary(alone),
            **{mode: _figures(rows) for mode, rows in timed.items() if mode != "cold"}}


def run(*, blocks: tuple[int, ...] = (50, 300), turns: int = 20, threads: int = 0, max_tokens: int = 8,
        typed_ahead: bool = False, history: int = 0, embedded_ahead: bool = False) -> dict:
    return {"bench": "overhead", "block_tokens": BLOCK_TOKENS, "max_tokens": max_tokens, "typed_ahead": typed_ahead,
            "embedded_ahead": embedded_ahead, "history": history,
            "counts": {str(n): _one_count(n, turns, threads, max_tokens, typed_ahead, history, embedded_ahead)
                       for n in blocks}}
