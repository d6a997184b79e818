"""The model-free retrieval bench: the real memory manager over the simulated KV cache, tokens from the GGUF's
vocabulary. With no eviction every probed fact is in context; with eviction every number is reported."""

from __future__ import annotations

import pytest

from benchmarks import retrieval

pytestmark = pytest.mark.slow


def test_no_eviction_keeps_every_fact_in_context_and_kv_restore_reports_the_headline():
    result = retrieval.run(families=retrieval.FAMILIES, seeds=1, seed_start=0, budgets=(512,),
                           backends=("none", "kv_restore"), keep_sessions=True)
    for family in retrieval.FAMILIES:
        ceiling = result["results"][f"{family}/none@512"]
        assert ceiling["fact_block_in_context"]["rate"] == 1.0
        assert ceiling["facts_cut_between_blocks"] == 0
        row = result["results"][f"{family}/kv_restore@512"]
        assert row["fact_block_in_context"]["n"] == 3
        assert row["decide_ms"]["p50"] is not None and row["block_tokens"]["file"]["max"] <= 128
        for run in result["raw"][f"{family}/kv_restore@512"]:
            assert all(probe["fact_blocks"] for probe in run["probes"])       # every fact line was found
            for decision in run["decisions"]:                                   # every recovery is explained
                assert {"block", "reason", "score", "signal"} <= set(decision)
    assert set(result["bars"]) == {f"{family}/kv_restore@512" for family in retrieval.FAMILIES}
