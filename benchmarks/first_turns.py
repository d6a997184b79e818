"""`python -m benchmarks first_turns --json`: the first token of Continue (the reply grows in its own cells, against
decoding its text again: the two paths of `TurnJobs.continue_reply`, side by side in one run) and of a first start
(the embedder exported for its first use on its own thread while the first message is answered, against a start
whose export is cached).

Invariant: every figure is a median over `trials` on the embedded model; the first-start rows use a fresh cache
folder per trial (XDG_CACHE_HOME), so the export really runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

from evoke_engine import Engine, EventKind, Settings
from evoke_engine.conversations import turn_jobs

QUESTION = "Count from 1 to 500, one number per line."      # a reply longer than `reply_tokens`: cut, to continue


def _first_token(submit) -> tuple[float, object]:
    began, first = time.perf_counter(), []
    reply = submit(on_token=lambda _piece: first or first.append(time.perf_counter() - began)).result()
    return (first[0] if first else float("nan")), reply


@contextlib.contextmanager
def _decoding_again() -> Iterator[None]:
    """The path a Continue took before it could grow in place: the reply's text decoded again."""
    kept = turn_jobs.resumable_reply
    turn_jobs.resumable_reply = lambda *args, **kwargs: None
    try:
        yield
    finally:
        turn_jobs.resumable_reply = kept


def continue_rows(trials: int, reply_tokens: int) -> dict:
    times: dict[str, list[float]] = {"in_place": [], "decoded_again": []}
    prefill: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as home, Engine(Settings(home=home, embedder="off"), scheduler=False) as eng:
        for _ in range(trials):
            for path in times:
                conv = eng.new_conversation()
                conv.submit(QUESTION, max_tokens=reply_tokens, temperature=0.0).result()
                with _decoding_again() if path == "decoded_again" else contextlib.nullcontext():
                    ttft, reply = _first_token(
                        lambda conv=conv, **kw: conv.continue_reply(max_tokens=8, temperature=0.0, **kw))
                times[path].append(ttft)
                prefill[path] = reply.prefill_tokens
                eng.delete_conversation(conv.id)
    med = {path: statistics.median(values) for path, values in times.items()}
    return {"reply_tokens": reply_tokens, "first_token_s": {p: round(v, 3) for p, v in med.items()},
            "prefill_tokens": prefill, "ratio_decoded_again_over_in_place": round(med["decoded_again"] /
                                                                                 med["in_place"], 1)}


def _start(cache: str) -> dict:
    """One start on `cache`: load, a new conversation and its first token, and when the embedder was ready."""
    os.environ["XDG_CACHE_HOME"] = cache
    ready, warming = threading.Event(), {}

    def note(event) -> None:
        if event.kind == EventKind.EMBEDDER_WARMING:
            warming.update(event.detail or {})
        elif event.kind == EventKind.EMBEDDER_READY:
            warming["ready_s"] = (event.detail or {}).get("seconds")
            ready.set()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as home, Engine(Settings(home=home), wait=False) as eng:
        eng.subscribe(note)
        eng.ready.result()
        loaded = time.perf_counter() - began
        made = time.perf_counter()
        conv = eng.new_conversation()
        new_s = time.perf_counter() - made
        ttft, _ = _first_token(lambda **kw: conv.submit("Say hi in five words.", max_tokens=8, temperature=0.0,
                                                        **kw))
        answered_before_ready = not ready.is_set()
        ready.wait(600)
    return {"load_s": round(loaded, 2), "new_conversation_s": round(new_s, 3), "first_token_s": round(ttft, 3),
            "answered_before_the_embedder_was_ready": answered_before_ready,
            "first_use": warming.get("first_use"), "embedder_ready_s": warming.get("ready_s")}


def _start_in_a_process(cache: str) -> dict:
    """`_start` in a process of its own, as a user's start is (nothing imported or loaded before it)."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.first_turns", cache], capture_output=True, text=True,
                          check=True, timeout=900)
    return json.loads(done.stdout.strip().splitlines()[-1])


def first_start_rows(trials: int) -> dict:
    with tempfile.TemporaryDirectory() as cached:
        _start_in_a_process(cached)                       # export once: the cached rows' cache
        rows: dict[str, list[dict]] = {"fresh_cache": [], "cached_export": []}
        for _ in range(trials):
            with tempfile.TemporaryDirectory() as fresh:
                rows["fresh_cache"].append(_start_in_a_process(fresh))
            rows["cached_export"].append(_start_in_a_process(cached))
    median = {kind: {key: statistics.median(r[key] for r in runs) for key in ("load_s", "new_conversation_s",
                                                                              "first_token_s", "embedder_ready_s")}
              for kind, runs in rows.items()}
    return {"median": median, "runs": rows}


def run(trials: int = 3, reply_tokens: int = 300) -> dict:
    return {"bench": "first_turns", "trials": trials, "continue": continue_rows(trials, reply_tokens),
            "first_start": first_start_rows(trials)}


if __name__ == "__main__":                                # one start, for `_start_in_a_process`
    print(json.dumps(_start(sys.argv[1])))
