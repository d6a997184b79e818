"""bench day's reworded script (issue 61's tuning script for the paraphrase forms) keeps the paraphrase script's
promises with lines of its own: every question shares no content word with its line, the line's context or its
file's path, none of its lines is another script's, and a day plants thirty facts each stated once before its probe."""

from __future__ import annotations

import pytest

from benchmarks.paraphrase_workload import FORMS
from benchmarks.paraphrase_workload import FRAMES as PARAPHRASE_FRAMES
from benchmarks.reworded_workload import FRAMES, REWORDED, shared
from benchmarks.workday_workload import DEV, HELD, MAX_GAP, MIN_GAP, _tokens, make_session

pytestmark = pytest.mark.unit


def test_no_question_shares_a_content_word_with_its_line_its_context_or_its_file():
    assert not [(line, q, words) for frames in FRAMES.values() for line, questions, _ in frames
                for q in questions if (words := shared(line, q))]


def test_the_check_reads_this_scripts_contexts():
    line = "    rating_floor SMALLINT DEFAULT {v},"
    assert shared(line, "What is the floor for players?") == {"floor", "players"}     # its SQL table: players
    assert shared('      - "{v}:9200"', "Which search port?") == {"search"}           # its compose service


def test_its_lines_are_no_other_scripts_and_its_forms_the_paraphrase_forms():
    others = {line for script in (DEV, HELD) for frames in script.frames.values() for line, _, _ in frames}
    others |= {line for frames in PARAPHRASE_FRAMES.values() for line, _, _ in frames}
    assert not others & {line for frames in FRAMES.values() for line, _, _ in frames}
    assert REWORDED.forms == FORMS


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_reworded_day_plants_thirty_facts_each_stated_once_and_probed_far_enough_later(seed):
    session = make_session(seed, REWORDED)
    assert len(session.facts) == 30 and {f.kind for f in session.facts} == set(FORMS)
    assert len({f.value for f in session.facts}) == 30
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
