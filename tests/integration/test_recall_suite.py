"""The recall suite's --quick run on the real model, marked slow (its generator: tests/unit/test_recall_workload.py)."""

from __future__ import annotations

import json

import pytest

from benchmarks.recall_workload import FACT_TYPES


@pytest.mark.slow
def test_quick_suite_prints_per_type_rates_and_explained_recoveries(capsys):
    from benchmarks.__main__ import main

    # One seed (three probes, every policy) instead of --quick's two: the same checks at half the time.
    assert main(["recall", "--suite", "--seeds", "1", "--budgets", "512", "--set", "recall_signal=lines+lexical"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["bench"] == "recall_suite" and result["budgets"] == [512]
    assert set(result["ceiling"]["per_type"]) == set(FACT_TYPES)
    restore = result["policies"]["kv_restore"]["512"]
    assert restore["evictions"] > 0 and restore["recoveries"] > 0
    assert restore["max_active_at_turn_end"] <= 512
    assert set(result["policies"]) == {"kv_restore", "breadcrumb", "discard"}
    explained = [d for s in result["raw"]["kv_restore@512"] for p in s["probes"] for d in p["explained"]]
    assert explained and all(d["signal"] == "lines+lexical" and "fused" in d for d in explained)
