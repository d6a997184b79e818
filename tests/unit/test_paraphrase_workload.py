"""bench day's paraphrase script (issue 61) keeps its promises: six forms of its own, none of the dev or held
forms' lines, every question sharing no content word with its line, the line's context or its file's path, and
the day's promises of `workday_workload` (values unique, stated once before the probe, gaps)."""

from __future__ import annotations

import re

import pytest

from benchmarks.paraphrase_workload import FORMS, FRAMES, PARAPHRASE, shared_words
from benchmarks.workday_workload import DEV, HELD, MAX_GAP, MIN_GAP, _tokens, make_session

pytestmark = pytest.mark.unit


def test_no_question_shares_a_content_word_with_its_line_its_context_or_its_file():
    shared = [(line, q, words) for frames in FRAMES.values() for line, questions, _ in frames
              for q in questions if (words := shared_words(line, q))]
    assert not shared


def test_the_check_sees_identifier_parts_units_and_context():
    line = '    "pageTurnAnimationMs": {v},'
    assert shared_words(line, "How long is the page animation?") == {"page", "animation"}
    assert shared_words(line, "How many milliseconds does it take?") == {"milliseconds"}
    assert shared_words(line, "What does the e-book reader do?") == {"reader"}     # its JSON section


def test_its_forms_are_none_of_the_dev_and_held_forms():
    assert not set(FORMS) & set(DEV.forms) and PARAPHRASE.forms == FORMS
    others = {line for script in (DEV, HELD) for frames in script.frames.values() for line, _, _ in frames}
    assert not others & {line for frames in FRAMES.values() for line, _, _ in frames}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_paraphrase_day_plants_thirty_facts_each_stated_once_and_probed_far_enough_later(seed):
    session = make_session(seed, PARAPHRASE)
    assert len(session.facts) == 30 and {f.kind for f in session.facts} == set(FORMS)
    values = [f.value for f in session.facts]
    assert len(set(values)) == len(values)
    ends, total = [], 0
    for turn in session.turns:
        total += _tokens(turn)
        ends.append(total)
    assert 25_000 <= total <= 36_000
    for fact in session.facts:
        said = [at for at, t in enumerate(session.turns)
                if fact.statement in t.text + "".join(b for _, b in t.attachments) + t.reply]
        asked = next(at for at, t in enumerate(session.turns) if t.fact is fact)
        assert len(said) == 1 and said[0] < asked
        assert MIN_GAP <= ends[asked] - ends[said[0]] <= MAX_GAP + 2_000
        others = [t.text + "".join(b for _, b in t.attachments) + t.reply
                  for at, t in enumerate(session.turns) if at != said[0]]
        repeats = [o for o in others if re.search(rf"(?<![\w.:-]){re.escape(fact.value)}(?![\w.:])", o)]
        assert not repeats, (fact.statement, repeats[0][:300])
