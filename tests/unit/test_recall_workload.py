"""The recall suite's generator and summary, plain logic (the slow --quick run on the real model is
tests/integration/test_recall_suite.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.recall_suite import summarize, wilson
from benchmarks.recall_workload import FACT_TYPES, Fact, make_session, overlap, passed

pytestmark = pytest.mark.unit


def test_sessions_are_a_function_of_their_seed_and_cover_every_type_evenly():
    assert make_session(5).turns[0].attachments == make_session(5).turns[0].attachments
    assert make_session(5).turns[0].attachments != make_session(6).turns[0].attachments
    counts = Counter(f.kind for seed in range(4) for f in make_session(seed).probed)
    assert set(counts) == set(FACT_TYPES) and max(counts.values()) - min(counts.values()) <= 1


def test_each_fact_is_in_exactly_one_place_and_its_value_is_unique():
    for seed in range(6):
        session = make_session(seed)
        texts = [body for turn in session.turns for _, body in turn.attachments]
        texts += [turn.text for turn in session.turns if not turn.attachments]
        for fact in session.facts:
            holders = [t for t in texts if fact.value in t]
            assert len(holders) == 1, (seed, fact.value)
        assert sum(f.where == "chat" for f in session.facts) == 1
        kinds = [t.kind for t in session.turns]
        assert kinds[:2] == ["attach", "chat_fact"] and kinds.count("probe") == 3
        assert {"short", "code", "log"} <= set(kinds)


def test_questions_are_paraphrases():
    facts = [f for seed in range(12) for f in make_session(seed).probed]
    assert sum(overlap(f) for f in facts) / len(facts) < 0.1


def test_answers_match_whole_tokens_only():
    fact = Fact("quantity", 0, "The upload limit is 237 MB.", "How big?", "237", ["237"])
    assert passed("It is 237 MB.", fact) and not passed("It is 2370 MB.", fact) and not passed("1237", fact)
    date = Fact("date", 0, "x", "y", "March 4, 2027", ["March", "4"])
    assert passed("On March 4th, 2027.", date) and not passed("On March 14, 2027.", date)
    path = Fact("path", 0, "x", "y", "/srv/a/b", ["/srv/a/b"])
    assert passed("It is /srv/a/b.", path) and not passed("It is /srv/a/b/c", path)


def test_wilson_interval_and_summary_shapes():
    assert wilson(0, 0) == [0.0, 1.0]
    low, high = wilson(5, 10)
    assert low < 0.5 < high
    row = {"type": "name", "where": "file", "passed": True, "fact_block_in_context": True, "recovered_tokens": 100,
           "recovered_fact_tokens": 60}
    summary = summarize([{"probes": [row], "turn_seconds": [1.0, 2.0], "recovered_tokens_per_turn": [0, 100],
                          "evictions": 3, "recoveries": 1, "max_active_at_turn_end": 400}])
    assert summary["per_type"]["name"]["passed"] == 1 and summary["per_type"]["date"]["n"] == 0
    assert summary["recovery_precision"] == 0.6 and summary["tokens_recovered_per_turn"] == 50.0
