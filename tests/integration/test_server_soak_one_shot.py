"""Issue 58 item 9's soak (marker `soak`: `make test-soak`, not `make test`): 1,000 one-shot requests to the endpoint
on the real model, each a new conversation never continued. The live API conversations stay within the caps (the
rest saved to their KV files and released) and the process's resident memory is flat after the first 100 requests.
EVOKE_SOAK_REQUESTS sets another count."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from helpers.server_fixtures import running_server

from evoke_engine.server.clients import new_token
from evoke_engine.server.security import ServerConfig

pytestmark = [pytest.mark.model, pytest.mark.soak]

REQUESTS = int(os.environ.get("EVOKE_SOAK_REQUESTS", "1000"))
WARM = 100                       # requests before the baseline is taken
RSS_SLACK_BYTES = 48 << 20       # allocator noise and the small per-conversation records (SQLite rows, stats)


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_a_thousand_one_shot_requests_keep_ram_flat(tmp_path):
    config = ServerConfig()
    tokens = [new_token() for _ in range(4)]            # four clients, as a few tools would be
    with running_server(tmp_path) as (engine, server), httpx.Client(timeout=300) as http:
        baseline = None
        samples = []
        for i in range(REQUESTS):
            body = {"model": "evoke", "max_tokens": 2, "temperature": 0,
                    "messages": [{"role": "user", "content": f"Request {i}: name a colour for item {i * 7919}."}]}
            response = http.post(server.address + "/chat/completions", json=body,
                                 headers={"X-Evoke-Client": tokens[i % len(tokens)]})
            assert response.status_code == 200, response.text
            if i + 1 == WARM:
                engine.wait_idle()
                baseline = rss_bytes()
            if (i + 1) % 100 == 0:
                engine.wait_idle()
                samples.append((i + 1, rss_bytes() >> 20))
        engine.wait_idle()
        live = [c for c in engine.conversations() if c.source == "api" and c.memory in ("slot", "ram")]
        grown = rss_bytes() - baseline
        print(f"RSS MiB by requests: {samples}; live API conversations {len(live)}")
        assert len(live) <= config.max_live, f"{len(live)} live API conversations after {REQUESTS} one-shot requests"
        assert grown <= RSS_SLACK_BYTES, f"RSS grew {grown >> 20} MiB after the first {WARM} requests: {samples}"
