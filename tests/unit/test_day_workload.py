"""The working-day retrieval workloads (day, ops, app, platform): pure in their seed, every fact line present once,
values unique, each probe asked in other words at least three turns after its fact."""

from __future__ import annotations

import re

import pytest

from benchmarks import app_workload, day_workload, ops_workload, platform_workload

pytestmark = pytest.mark.unit
FAMILIES = [pytest.param(day_workload, id="day"), pytest.param(ops_workload, id="ops"),
            pytest.param(app_workload, id="app"), pytest.param(platform_workload, id="platform")]


def _body(turn) -> str:
    return turn.text + "".join(body for _, body in turn.attachments)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", range(8))
def test_a_day_states_each_fact_once_and_asks_it_later_in_other_words(family, seed):
    session = family.make_session(seed, probes=3)
    assert [_body(t) for t in family.make_session(seed, probes=3).turns] == [_body(t) for t in session.turns]
    text = "\n".join(_body(t) for t in session.turns)
    assert {f.kind for f in session.facts} == set(family.FACT_TYPES)
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


@pytest.mark.parametrize("family", FAMILIES)
def test_probed_types_rotate_with_the_seed(family):
    kinds = {t.fact.kind for seed in range(3) for t in family.make_session(seed, probes=3).turns if t.fact is not None}
    assert kinds == set(family.FACT_TYPES)


@pytest.mark.parametrize("family", FAMILIES)
def test_no_question_repeats_a_word_of_its_fact_line_beyond_the_file_kind(family):
    """A probe that quoted its line would test the lexical signal's easiest case only; the questions keep to other
    words (a file kind a user would name, such as 'Postgres' or 'GitHub', may appear; a value never does)."""
    for frames in family.FRAMES.values():
        for line, _, questions, _ in frames:
            words = {w.lower() for w in re.findall(r"[A-Za-z]{4,}", line.replace("{v}", ""))}
            for question in questions:
                shared = words & {w.lower() for w in re.findall(r"[A-Za-z]{4,}", question)}
                assert len(shared) <= 1, (line, question, shared)
