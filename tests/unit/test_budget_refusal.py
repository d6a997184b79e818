"""The one refusal of a budget below the smallest that works (`require_budget`): a new conversation, a settings change
and a conversation's own budget all refuse it with the same message, which names the smallest budget and what it
must hold. On plain values and on a whole Engine over the simulator."""

from __future__ import annotations

import dataclasses

import pytest
from helpers.sim_backend import SimBackend, sim_engine, sim_settings

from evoke_engine import BudgetError
from evoke_engine.memory.memory import min_budget_tokens, require_budget

pytestmark = pytest.mark.unit


def _refusal(budget: int, prefix_tokens: int, smallest: int) -> str:
    """The wording every path must use (block_tokens 16, tail_fraction 0.25: the simulator's settings)."""
    return (f"a budget of {budget} tokens is too small: the smallest budget that works is {smallest} tokens, which "
            f"holds the shared prefix (system prompt and tools, {prefix_tokens} tokens) and the recent tail that is "
            "never evicted (25% of the budget and one 16-token block), so that a reply of any length grows without "
            "being cut")


def test_require_budget_accepts_the_smallest_and_refuses_one_less_saying_why(tmp_path):
    settings = sim_settings(tmp_path, tail_fraction=0.25)
    smallest = min_budget_tokens(100, settings)
    require_budget(smallest, 100, 0, settings)
    with pytest.raises(BudgetError) as refused:
        require_budget(smallest - 1, 100, 0, settings)
    assert str(refused.value) == _refusal(smallest - 1, 100, smallest)
    with pytest.raises(BudgetError, match="the first block \\(the sink, 16 tokens\\)"):
        require_budget(1, 0, 0, settings)                   # no prefix: the sink block stands in for it
    require_budget(min_budget_tokens(130, settings), 100, 30, settings)     # kept blocks are held like the prefix
    with pytest.raises(BudgetError, match="the kept files and pinned blocks \\(30 tokens"):
        require_budget(min_budget_tokens(130, settings) - 1, 100, 30, settings)


def test_a_new_conversation_a_settings_change_and_an_own_budget_refuse_with_one_message(tmp_path):
    backend = SimBackend(tmp_path / "sim.gguf")
    with sim_engine(backend, sim_settings(tmp_path, tail_fraction=0.25)) as (engine, _):
        conv = engine.new_conversation()
        prefix = engine.stats(conv.id).prefix_tokens
        smallest = engine.min_budget_tokens()
        assert prefix > 0 and smallest == min_budget_tokens(prefix, engine.settings)
        expected = _refusal(smallest - 1, prefix, smallest)

        with pytest.raises(BudgetError) as own:
            engine.set_budget(conv.id, smallest - 1)
        with pytest.raises(BudgetError) as changed:
            engine.apply_settings(dataclasses.replace(engine.settings, budget_tokens=smallest - 1))
        assert (str(own.value), str(changed.value)) == (expected, expected)
        assert engine.settings.budget_tokens == 512 and engine.stats(conv.id).budget_tokens == 512   # nothing changed

    small = sim_settings(tmp_path / "small", tail_fraction=0.25, budget_tokens=smallest - 1)
    with sim_engine(SimBackend(tmp_path / "sim.gguf"), small) as (engine, _), pytest.raises(BudgetError) as created:
        engine.new_conversation()
    assert str(created.value) == expected
