"""The model as a second-stage retriever (`bench rerank`): the question scorer reads the real model's logits in the
scratch sequence, and the bench ranks every probe turn's recoveries in each order."""

from __future__ import annotations

import pytest

from benchmarks import rerank
from evoke_engine.runtime.runtime import Runtime
from evoke_engine.settings import Settings


def test_a_question_is_likelier_after_its_own_words_than_after_unrelated_text(tmp_path):
    rt = Runtime(Settings(home=str(tmp_path), n_ctx=2048, slots=1))
    try:
        scorer = rerank.QuestionScorer(rt)
        question = rt.tokenize("<|im_start|>user\nWhich port does the billing service listen on?<|im_end|>\n")
        echo = rt.tokenize("The billing service listens on port 8443.\n")
        other = rt.tokenize("Bananas are yellow and grow in bunches near the equator.\n")
        after_echo, after_other = scorer.token_logprobs(echo, question), scorer.token_logprobs(other, question)
        assert after_echo.shape == after_other.shape == (len(question) - 1,)
        assert (after_echo <= 0).all() and after_echo.sum() > after_other.sum()
        assert scorer.kv.pos_max(rt.scratch_seq) == -1               # the scratch sequence is left empty
    finally:
        rt.close()


@pytest.mark.slow
def test_the_bench_ranks_each_probe_turns_recoveries_in_every_order():
    result = rerank.run(families=("suite",), seeds=1, seed_start=0, budget=256)
    assert result["probe_turns"] >= 1 and result["candidates_per_turn"] >= 1
    for name in rerank.ORDERS:
        tops = [result["fact_block_rank"][name][f"top{k}"]["k"] for k in (1, 2, 3)]
        assert tops == sorted(tops) and tops[-1] <= result["probe_turns"]
    assert result["model_ms"]["per_turn_p50"] > 0
