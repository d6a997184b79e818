"""The held-out retrieval workload: pure in its seed, every fact line present once, values unique."""

from __future__ import annotations

import re

import pytest

from benchmarks.retrieval_workload import FACT_TYPES, make_session

pytestmark = pytest.mark.unit


def _all_text(session) -> str:
    return "\n".join(t.text + "".join(body for _, body in t.attachments) for t in session.turns)


@pytest.mark.parametrize("seed", range(8))
def test_a_session_states_each_fact_line_once_and_asks_in_other_words(seed):
    session = make_session(seed)
    assert make_session(seed).turns[0].attachments == session.turns[0].attachments
    text = _all_text(session)
    assert {f.kind for f in session.facts} == set(FACT_TYPES)
    for fact in session.facts:
        assert text.count(fact.statement.strip()) == 1
        whole = re.findall(rf"(?<![\w.-]){re.escape(fact.value)}(?![\w-])", text)
        assert len(whole) == 1, fact.value                             # look-alikes carry other values
    probes = [t for t in session.turns if t.fact is not None]
    assert len(probes) == 3 and all(t.reply for t in session.turns)
    for probe in probes:
        assert probe.fact.value not in probe.text


def test_probed_types_rotate_with_the_seed():
    kinds = {t.fact.kind for seed in (0, 1) for t in make_session(seed).turns if t.fact is not None}
    assert kinds == set(FACT_TYPES)
