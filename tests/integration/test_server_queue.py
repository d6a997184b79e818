"""A reply that waits for its turn to start (issue 59): with one reply at a time, a second streamed request says
where it stands (`X-Evoke-Queue: 1`, `: queued 1` comments while it waits, never an error), and its usage and
`/metrics` count how long it waited; the first request's own figures say it waited for nothing."""

from __future__ import annotations

import json
import threading

import httpx
from helpers.server_fixtures import running_server

from evoke_engine import Settings


def stream_lines(address: str, body: dict, token: str, into: dict) -> None:
    with httpx.Client(timeout=300) as http, http.stream(
            "POST", f"{address}/chat/completions", json=body, headers={"X-Evoke-Client": token}) as response:
        into["status"], into["queue"] = response.status_code, response.headers.get("X-Evoke-Queue")
        into["lines"] = list(response.iter_lines())


def test_a_queued_stream_says_its_place_and_its_wait(tmp_path):
    settings = Settings(home=str(tmp_path), budget_tokens=512, temperature=0.0, parallel_replies=1)
    with running_server(tmp_path, settings=settings) as (engine, server):
        first, second = {}, {}
        never_ends = {str(t): -100 for t in engine.tokenize("<|im_end|><|endoftext|>", special=True)}
        # long enough that the second request waits past its first ": queued" line (1 s) on a fast moment too
        long = {"model": "evoke", "stream": True, "max_tokens": 350, "temperature": 0, "logit_bias": never_ends,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "Count from one to two hundred in words."}]}
        short = {**long, "max_tokens": 8, "logit_bias": {}, "messages": [{"role": "user", "content": "Say hi."}]}
        a = threading.Thread(target=stream_lines, args=(server.address, long, "a" * 32, first))
        a.start()
        while engine.reply_counts()[0] == 0:                   # the first reply streams
            threading.Event().wait(0.02)
        stream_lines(server.address, short, "b" * 32, second)
        a.join(300)
        assert first["status"] == second["status"] == 200
        assert first["queue"] == "0" and second["queue"] == "1"
        queued = [line for line in second["lines"] if line.startswith(": queued")]
        assert queued and set(queued) == {": queued 1"}           # told each second while it waited
        usage = [json.loads(line[6:]) for line in second["lines"] if line.startswith("data: {")][-1]
        assert usage["usage"]["completion_tokens"] > 0
        assert usage["evoke"]["queue_ms"] > 100                  # it waited for the first reply to end
        figures = [json.loads(line[6:]) for line in first["lines"] if line.startswith("data: {")][-1]["evoke"]
        assert figures["queue_ms"] < 1000 and figures["tokens_per_s"] > 0
        metrics = httpx.get(f"{server.address.removesuffix('/v1')}/metrics", timeout=30).text
        assert "evoke_queue_wait_seconds_count 2" in metrics
