"""`recall_suite.attention_rerank` on plain probe rows: where the fact's block ranks among a turn's similarity
recoveries by the signal's score, by the message's attention (per block, per token) and by both fused."""

from __future__ import annotations

import pytest

from benchmarks.recall_suite import attention_rerank

pytestmark = pytest.mark.unit


def _decision(block: str, score: float, share: float, per_token: float, reason: str = "similar") -> dict:
    return {"block": block, "reason": reason, "score": score, "message_attention": share,
            "message_attention_per_token": per_token}


def test_ranks_the_fact_block_by_each_order():
    probe = {"fact_blocks": ["f#1"], "decisions": [
        _decision("a#1", 0.033, 0.9, 1.0), _decision("f#1", 0.032, 0.5, 0.6), _decision("b#1", 0.031, 1.0, 0.2),
        _decision("named#1", 0.0, 1.0, 1.0, reason="named")]}      # not a similarity recovery: not ranked
    out = attention_rerank([probe])
    assert out["probes"] == 1 and out["candidates_mean"] == 3
    assert out["signal"] == {"top1": 0, "top2": 1, "top3": 1}            # second by score
    assert out["attention"] == {"top1": 0, "top2": 0, "top3": 1}         # third by share
    assert out["attention_per_token"] == {"top1": 0, "top2": 1, "top3": 1}
    assert out["fused"] == {"top1": 0, "top2": 1, "top3": 1}             # rank sums 2, 4, 6: second


def test_no_attention_or_no_recovered_fact_is_no_measure():
    unmeasured = {"fact_blocks": ["f#1"], "decisions": [_decision("f#1", 0.03, None, None)]}
    elsewhere = {"fact_blocks": ["f#1"], "decisions": [_decision("a#1", 0.03, 1.0, 1.0)]}
    assert attention_rerank([unmeasured, elsewhere, {"fact_blocks": [], "decisions": []}]) is None
