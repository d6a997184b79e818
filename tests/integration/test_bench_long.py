"""`bench long --quick` at a tiny token target through the CLI: the JSON's shape, fixed-length replies in every
system, and nothing lost where Evoke spills every saved block to disk (no timed assertion)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SERVER = Path(__file__).resolve().parents[2] / "build" / "llama-server" / "llama-server"


def test_bench_long_quick_prints_every_turn_and_loses_nothing(tmp_path):
    systems = ["evoke_2048_ram64m", "llama_cpp_python_full"]
    cmd = [sys.executable, "-m", "benchmarks", "long", "--quick", "--tokens", "2500", "--ram-mib", "1",
           "--csv", str(tmp_path / "long.csv"), "--plots", str(tmp_path), "--json"]
    if SERVER.is_file() and os.environ.get("EVOKE_TEST_SERVERS") == "1":   # the two servers double the run time
        systems += ["llama_server_full", "llama_server_shift"]
        cmd += ["--server", str(SERVER), "--shift-ctx", "1024"]
    cmd += ["--systems", ",".join(systems)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)

    assert result["bench"] == "long" and result["turns"] >= 10 and set(result["systems"]) == set(systems)
    assert result["workload"]["probe_turns"] and result["workload"]["facts"]
    for label in systems:
        summary, rows = result["systems"][label], result["rows"][label]
        assert summary["error"] is None and summary["turns_done"] == result["turns"] == len(rows), label
        for row in rows:
            assert row["reply_tokens"] == row["reply_tokens_asked"], (label, row)   # end of generation banned
            assert row["ttft_s"] > 0 and row["rss_bytes"] > 0 and row["conversation_tokens"] > 0
        probes = [r for r in rows if r["kind"] == "probe"]
        assert probes and all(isinstance(r["fact_in_context"], bool) for r in probes)
    assert result["rows"]["llama_cpp_python_full"][-1]["conversation_tokens"] >= 2500
    if "llama_server_shift" in systems:                        # a 1K context has dropped the early facts
        assert result["rows"]["llama_server_shift"][-1]["dropped_exchanges"] > 0
        assert result["systems"]["llama_server_full"]["fact_rate"] == 1.0

    evoke = result["systems"]["evoke_2048_ram64m"]["memory"]
    last = result["rows"]["evoke_2048_ram64m"][-1]
    assert last["evictions"] > 0 and evoke["spill_bytes"] > 0 and evoke["disk_tokens"] > 0
    assert evoke["drops"] == 0 and last["dropped_tokens"] == 0          # nothing lost: every saved block is held
    assert evoke["recovered_from_disk"] > 0                             # and blocks came back from disk
    assert evoke["disk_over_raw"] <= 1.05                              # the K/V bytes, no more
    assert last["conversation_tokens"] >= 2500

    with open(tmp_path / "long.csv") as fh:
        assert len(list(csv.DictReader(fh))) == sum(len(result["rows"][s]) for s in systems)
    assert sorted(p.name for p in tmp_path.glob("long-chat-*.png")) == \
        ["long-chat-decode.png", "long-chat-rss.png", "long-chat-ttft.png"]
