"""The third retrieval workload (a working day): pure in its seed, every fact line present once, values unique,
each probe asked in other words at least three turns after its fact."""

from __future__ import annotations

import re

import pytest

from evoke_engine.bench.day_workload import FACT_TYPES, make_session

pytestmark = pytest.mark.unit


def _body(turn) -> str:
    return turn.text + "".join(body for _, body in turn.attachments)


@pytest.mark.parametrize("seed", range(8))
def test_a_day_states_each_fact_once_and_asks_it_later_in_other_words(seed):
    session = make_session(seed, probes=3)
    assert [_body(t) for t in make_session(seed, probes=3).turns] == [_body(t) for t in session.turns]
    text = "\n".join(_body(t) for t in session.turns)
    assert {f.kind for f in session.facts} == set(FACT_TYPES)
    for fact in session.facts:
        assert text.count(fact.statement.strip()) == 1
        whole = re.findall(rf"(?<![\d.]){re.escape(fact.value)}(?![\d])", text)      # `15m`, `1.21`: units glued
        assert len(whole) == 1, fact.value                             # look-alikes and fillers carry others
    stated = {id(f): next(i for i, t in enumerate(session.turns) if f.statement in _body(t)) for f in session.facts}
    probes = [(i, t) for i, t in enumerate(session.turns) if t.fact is not None]
    assert len(probes) == 3 and all(t.reply for t in session.turns)
    for at, probe in probes:
        assert at - stated[id(probe.fact)] >= 3
        assert probe.fact.value not in probe.text


def test_probed_types_rotate_with_the_seed():
    kinds = {t.fact.kind for seed in range(3) for t in make_session(seed, probes=3).turns if t.fact is not None}
    assert kinds == set(FACT_TYPES)
