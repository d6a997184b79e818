"""`bench gloss-idle`: the gloss writer (issue 61) as the engine runs it, on the real model: a day session's turns
(files with value lines, chat, questions) sent to one conversation with a user's think time between them; what the
writer cost per block and what share of the idle time it took, and how long the turns that arrived while it wrote
waited for it.

Invariants: the engine is the product's own (`recall_glosses` on, the writer wired as `Engine` wires it); idle time is
the think time the bench sleeps between a reply's end and the next message, plus a last one and the wait until the
engine is idle after it (no other work runs then);
a turn's wait is its job's queue time from the engine thread's own DEBUG line; nothing is timed inside a test.
"""

from __future__ import annotations

import logging
import re
import statistics
import tempfile
import time

from evoke_engine import Engine, Settings
from evoke_engine.conversations.gloss_writer import blocks_to_gloss

from .day_workload import make_session

_QUEUED = re.compile(r"job \d+ (?:turn) \S+ started after ([\d.]+) ms queued")


class TurnWaits(logging.Handler):
    """Each turn job's queue time, from the worker's DEBUG line as it starts."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.waits_ms: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = _QUEUED.match(record.getMessage())
        if found:
            self.waits_ms.append(float(found.group(1)))


def run(*, seed: int = 0, turns: int = 14, think_s: float = 6.0, budget_tokens: int = 1024,
        reply_tokens: int = 16, model_path: str | None = None, threads: int = 0) -> dict:
    session = make_session(seed)
    script = session.turns[:turns]
    settings = Settings(home=tempfile.mkdtemp(prefix="bench-gloss-idle-"), model_path=model_path, slots=2,
                        budget_tokens=budget_tokens, n_ctx=8192, recall_glosses="on", n_threads=threads)
    worker_log = logging.getLogger("evoke_engine.worker")
    waits, level, propagate = TurnWaits(), worker_log.level, worker_log.propagate
    worker_log.addHandler(waits)
    worker_log.setLevel(logging.DEBUG)
    worker_log.propagate = False                    # its DEBUG lines to the bench's handler only
    try:
        with Engine(settings, scheduler=False) as engine:
            engine.wait_idle()
            writer = engine.turns.glosses
            conv = engine.new_conversation()
            idle_s, interrupted_turns, rows = 0.0, 0, []
            for turn in script:
                writing = writer.total.interrupted
                began = time.perf_counter()
                reply = conv.submit(turn.text, attachments=turn.attachments, max_tokens=reply_tokens,
                                    temperature=0).result()
                stopped_writer = writer.total.interrupted > writing
                interrupted_turns += stopped_writer
                rows.append({"kind": turn.kind, "ttft_s": round(reply.ttft_s, 3),
                             "wall_s": round(time.perf_counter() - began, 3), "stopped_the_writer": stopped_writer})
                time.sleep(think_s)
                idle_s += think_s
            time.sleep(think_s)                                   # the last message's idle time
            drained = time.perf_counter()
            engine.wait_idle()                                    # and what the writer still had to do after it
            idle_s += think_s + time.perf_counter() - drained
            state = engine.lifecycle.get(conv.id)
            left = engine.thread.call(lambda: len(blocks_to_gloss(list(state.memory.table.blocks))))
            cost = writer.total
    finally:
        worker_log.removeHandler(waits)
        worker_log.setLevel(level)
        worker_log.propagate = propagate
    turn_waits = waits.waits_ms[-len(script):]
    for row, wait in zip(rows, turn_waits, strict=False):
        row["queued_ms"] = wait
    cut_waits = [row["queued_ms"] for row in rows if row["stopped_the_writer"] and "queued_ms" in row]
    per_block = cost.wall_s / cost.blocks if cost.blocks else None
    return {"seed": seed, "turns": len(script), "think_s": think_s, "budget_tokens": budget_tokens,
            "reply_tokens": reply_tokens, "model": settings.model_path or "embedded SmolLM2-135M",
            "writer": {"runs": cost.runs, "blocks": cost.blocks, "lines": cost.lines,
                       "glossed_lines": cost.glossed_lines, "prompt_tokens": cost.prompt_tokens,
                       "reply_tokens": cost.reply_tokens, "wall_s": round(cost.wall_s, 2),
                       "model_s": round(cost.model_s, 2), "embed_s": round(cost.embed_s, 2),
                       "runs_stopped_by_a_turn": cost.interrupted},
            "per_block_s": round(per_block, 3) if per_block is not None else None,
            "model_per_block_s": round(cost.model_s / cost.blocks, 3) if cost.blocks else None,
            "idle_s": round(idle_s, 2), "idle_share": round(cost.wall_s / idle_s, 3),
            "blocks_left_unglossed": left,
            "turns_that_stopped_the_writer": interrupted_turns,
            "turn_queue_ms": {"median": round(statistics.median(turn_waits), 1) if turn_waits else None,
                              "max": round(max(turn_waits), 1) if turn_waits else None,
                              "max_of_turns_that_stopped_the_writer": max(cut_waits, default=None)},
            "turns_detail": rows}
