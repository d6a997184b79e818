"""Issue 46: the recovery width grows with the budget (`recovery_width_share`): a day at 2048 or 4096 tokens considers
more blocks than the fixed `recovery_top_k`; budgets up to 1024 (the recall suite's, the retrieval bench's) keep it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evoke_engine.kvcache.blocks import Block, BlockState
from evoke_engine.memory.memory import ConversationMemory
from evoke_engine.settings import Settings

pytestmark = pytest.mark.unit


def _memory(budget: int, **overrides) -> SimpleNamespace:
    memory = SimpleNamespace(settings=Settings(home="/nonexistent-evoke-home", **overrides), budget_tokens=budget)
    memory.recovery_width = lambda: ConversationMemory.recovery_width(memory)
    return memory


@pytest.mark.parametrize(("budget", "width"), [(256, 8), (512, 8), (1024, 8), (2048, 16), (4096, 32)])
def test_the_width_scales_with_the_budget_above_the_top_k_floor(budget, width):
    assert _memory(budget).recovery_width() == width


def test_top_k_zero_still_turns_similarity_recovery_off():
    assert _memory(4096, recovery_top_k=0).recovery_width() == 0


def test_share_zero_is_the_fixed_top_k():
    assert _memory(4096, recovery_width_share=0.0).recovery_width() == 8


def test_the_working_set_at_4096_holds_the_fact_ranked_twentieth():
    memory = _memory(4096)
    saved = [Block(name=f"b{i}", role="file", turn=1, tokens=list(range(10)), text=f"b{i}") for i in range(40)]
    for block in saved:
        block.state = BlockState.RAM
    rank = {block: i for i, block in enumerate(saved)}
    signal = SimpleNamespace(similarity=lambda b: -rank[b])
    working = ConversationMemory._working_set(memory, saved, [], signal)
    assert len(working) == 32 and saved[19] in working and saved[32] not in working
