"""A turn's breakdown (issue 44): the remainder is the engine's own Python, never negative; the first token's is
kept apart from the whole turn's; the memory panel's line names the largest phases first."""

from __future__ import annotations

import pytest

from app.widgets.memory_panel import breakdown_text
from evoke_engine.conversations.breakdown import TurnBreakdown

pytestmark = pytest.mark.unit


def test_the_remainder_is_python_and_the_first_token_is_kept_apart():
    clock = TurnBreakdown()
    clock.add("decide", 0.002)
    clock.add("prompt_decode", 0.05)
    clock.mark_first_token(0.06)
    clock.add("token_decode", 0.5)
    clock.finish(0.6)
    out = clock.as_dict()
    assert out["first_token"]["python_s"] == pytest.approx(0.008) and out["first_token"]["total_s"] == 0.06
    assert out["first_token"]["outside_llama_s"] == pytest.approx(0.01)
    assert out["python_s"] == pytest.approx(0.048) and out["token_decode_s"] == 0.5


def test_an_overrun_phase_never_makes_python_negative():
    clock = TurnBreakdown()
    clock.add("sample", 0.2)
    clock.finish(0.1)
    assert clock.as_dict()["python_s"] == 0.0


def test_the_panel_line_names_the_largest_phases_first():
    clock = TurnBreakdown()
    clock.add("prompt_decode", 0.120)
    clock.add("embed", 0.030)
    clock.mark_first_token(0.160)
    text = breakdown_text(clock.as_dict())
    assert text.startswith("Last first token 160 ms: prompt decode 120 · embed 30 · python 10")
    assert breakdown_text({}) == ""
