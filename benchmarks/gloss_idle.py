"""`bench gloss-idle`: the gloss writer (issue 61) as the engine runs it, on the real model: a day session's turns
(files with value lines, chat, questions) sent to one conversation with a user's think time between them; what the
writer cost per block and what share of the idle time it took, and how long the turns that arrived while it wrote
waited for it.

Invariants: the engine is the product's own (`recall_glosses` on, the writer wired as `Engine` wires it); idle time is
the think time the bench sleeps between a reply's end and the next message, plus a last one and the wait until the
engine is idle after it (no other work runs then);
a turn's wait is its job's queue time as the engine thread stamps it (`future.waited_s`, the endpoint's `queue_ms`);
nothing is timed inside a test.
"""

from __future__ import annotations

import statistics
import tempfile
import time

from evoke_engine import Engine, Settings
from evoke_engine.conversations.gloss_writer import blocks_to_gloss

from .day_workload import make_session


def run(*, seed: int = 0, turns: int = 14, think_s: float = 6.0, budget_tokens: int = 1024,
        reply_tokens: int = 16, model_path: str | None = None, threads: int = 0) -> dict:
    session = make_session(seed)
    script = session.turns[:turns]
    settings = Settings(home=tempfile.mkdtemp(prefix="bench-gloss-idle-"), model_path=model_path, slots=2,
                        budget_tokens=budget_tokens, n_ctx=8192, recall_glosses="on", n_threads=threads)
    with Engine(settings, scheduler=False) as engine:
        engine.wait_idle()
        writer = engine.turns.glosses
        conv = engine.new_conversation()
        idle_s, rows = 0.0, []
        for turn in script:
            writing = writer.total.interrupted
            began = time.perf_counter()
            future = conv.submit(turn.text, attachments=turn.attachments, max_tokens=reply_tokens, temperature=0)
            reply = future.result()
            stopped_writer = writer.total.interrupted > writing
            rows.append({"kind": turn.kind, "ttft_s": round(reply.ttft_s, 3),
                         "wall_s": round(time.perf_counter() - began, 3), "stopped_the_writer": stopped_writer,
                         "queued_ms": round(future.waited_s * 1000, 1)})
            time.sleep(think_s)
            idle_s += think_s
        time.sleep(think_s)                                       # the last message's idle time
        drained = time.perf_counter()
        engine.wait_idle()                                        # and what the writer still had to do after it
        idle_s += think_s + time.perf_counter() - drained
        state = engine.lifecycle.get(conv.id)
        left = engine.thread.call(lambda: len(blocks_to_gloss(list(state.memory.table.blocks))))
        cost = writer.total
    turn_waits = [row["queued_ms"] for row in rows]
    cut_waits = [row["queued_ms"] for row in rows if row["stopped_the_writer"]]
    per_block = cost.wall_s / cost.blocks if cost.blocks else None
    return {"seed": seed, "turns": len(script), "think_s": think_s, "budget_tokens": budget_tokens,
            "reply_tokens": reply_tokens, "model": settings.model_path or "embedded SmolLM2-135M",
            "writer": {"runs": cost.runs, "blocks": cost.blocks, "lines": cost.lines,
                       "glossed_lines": cost.glossed_lines, "prompt_tokens": cost.prompt_tokens,
                       "reply_tokens": cost.reply_tokens, "wall_s": round(cost.wall_s, 2),
                       "model_s": round(cost.model_s, 2), "embed_s": round(cost.embed_s, 2),
                       "runs_stopped_by_a_turn": cost.interrupted, "blocks_resumed": cost.resumed},
            "per_block_s": round(per_block, 3) if per_block is not None else None,
            "model_per_block_s": round(cost.model_s / cost.blocks, 3) if cost.blocks else None,
            "idle_s": round(idle_s, 2), "idle_share": round(cost.wall_s / idle_s, 3),
            "blocks_left_unglossed": left,
            "turns_that_stopped_the_writer": len(cut_waits),
            "turn_queue_ms": {"median": round(statistics.median(turn_waits), 1) if turn_waits else None,
                              "max": round(max(turn_waits), 1) if turn_waits else None,
                              "max_of_turns_that_stopped_the_writer": max(cut_waits, default=None)},
            "turns_detail": rows}
