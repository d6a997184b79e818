"""A question's vector made of the question alone (issue 61, third pass, `recall_signals.QUESTION_QUERY`): which part
of a message `question_only` keeps, and the memory embedding it only where the lever is on and the working set has
grown."""

from __future__ import annotations

import dataclasses

import pytest
from helpers.rig import Rig

from evoke_engine.memory import recall_signals
from evoke_engine.memory.recall_signals import question_only

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("message, question", [
    ("Sorry, I forgot: What per-refresh time allowance does the game loop have? Need it for the ticket.",
     "What per-refresh time allowance does the game loop have?"),
    ("Quick one: How long does the proxy wait? Thanks!", "How long does the proxy wait?"),
    ("How many workers? And which port?", "How many workers? And which port?"),
])
def test_a_message_that_asks_for_a_value_keeps_its_questions_without_their_lead_in(message, question):
    assert question_only(message) == question


@pytest.mark.parametrize("message", ["We set it to 30, right?", "Here is the file.", "Is port 8080 free?",
                                     "Which one did we pick for 2024?"])
def test_a_message_that_asks_for_no_value_stays_whole(message):
    assert question_only(message) == message


def test_the_memory_embeds_the_question_alone_only_when_on_and_the_working_set_has_grown(tmp_path, monkeypatch):
    message = "Quick one: How long does the proxy wait? Thanks!"
    rig = Rig(tmp_path, recall_signal="lines", recovery_top_k=2)            # a budget of 200 tokens
    try:
        for on, per, expect in [(False, 100, message), (True, 1024, message), (True, 100, question_only(message))]:
            monkeypatch.setattr(recall_signals, "QUESTION_QUERY", on)
            memory = rig.memory(f"c{on}{per}", settings=dataclasses.replace(rig.settings, recovery_width_tokens=per))
            assert memory._dense_query(message) == expect, (on, per)
            memory.release()
    finally:
        rig.close()
