"""bench day's workload keeps its promises: 30 facts in six forms per session, values unique, every fact stated
verbatim once before its probe, probes 2K-25K estimated tokens later, the dev and held scripts disjoint."""

from __future__ import annotations

import re

import pytest

from benchmarks.workday_workload import DEV, FORMS, HELD, MAX_GAP, MIN_GAP, _tokens, make_session

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("script", [DEV, HELD], ids=["dev", "held"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_day_plants_thirty_facts_in_six_forms_and_probes_each_far_enough_later(script, seed):
    session = make_session(seed, script)
    assert len(session.facts) == 30 and {f.kind for f in session.facts} == set(FORMS)
    assert sorted(map(id, session.probed)) == sorted(map(id, session.facts))          # each probed once
    values = [f.value for f in session.facts]
    assert len(set(values)) == len(values)
    ends, total = [], 0
    for turn in session.turns:
        total += _tokens(turn)
        ends.append(total)
    assert 25_000 <= total <= 36_000                                  # text tokens (estimated); ~32K with the template
    for fact in session.facts:
        said = [at for at, t in enumerate(session.turns)
                if fact.statement in t.text + "".join(b for _, b in t.attachments) + t.reply]
        asked = next(at for at, t in enumerate(session.turns) if t.fact is fact)
        assert len(said) == 1 and said[0] < asked
        assert MIN_GAP <= ends[asked] - ends[said[0]] <= MAX_GAP + 2_000
        others = [t.text + "".join(b for _, b in t.attachments) + t.reply
                  for at, t in enumerate(session.turns) if at != said[0]]
        if not fact.value.replace(" ", "").isalpha():                     # a number: no filler repeats it
            repeats = [o for o in others if re.search(rf"(?<![\w.-]){re.escape(fact.value)}(?![\w.])", o)]
            assert not repeats, (fact.statement, repeats[0][:300])


def test_the_held_back_script_shares_no_fact_line_with_the_dev_script():
    dev = {line for frames in DEV.frames.values() for line, _, _ in frames}
    held = {line for frames in HELD.frames.values() for line, _, _ in frames}
    assert not dev & held


def test_the_summary_counts_a_fact_lost_during_its_reply_apart_from_one_missing_as_it_starts():
    from benchmarks.workday import summarize
    rows = [{"type": FORMS[0], "in_context": True, "through_reply": True, "distance": 3_000},
            {"type": FORMS[0], "in_context": True, "through_reply": False, "distance": 3_000},
            {"type": FORMS[1], "in_context": False, "through_reply": False, "distance": 6_000}]
    summary = summarize(rows, [10.0, 12.0, 11.0], 2048)
    assert summary["fact_block_in_context"]["in_context"] == 2
    assert summary["fact_block_through_reply"] == {"in_context": 1, "n": 3, "rate": 0.333}
