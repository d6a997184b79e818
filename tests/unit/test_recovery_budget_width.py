"""Issue 46: the recovery width grows with the budget (`recovery_width_tokens`): a day at 2048 or 4096 tokens considers
more blocks than the fixed `recovery_top_k`; budgets up to 1024 (the recall suite's, the retrieval bench's) keep it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evoke_engine.kvcache.blocks import Block, BlockState
from evoke_engine.memory.memory import ConversationMemory
from evoke_engine.memory.policy import file_neighbours
from evoke_engine.settings import Settings

pytestmark = pytest.mark.unit


def _memory(budget: int, **overrides) -> SimpleNamespace:
    memory = SimpleNamespace(settings=Settings(home="/nonexistent-evoke-home", **overrides), budget_tokens=budget,
                             _query_text="")
    memory.recovery_width = lambda: ConversationMemory.recovery_width(memory)
    return memory


@pytest.mark.parametrize(("budget", "width"), [(256, 8), (512, 8), (1024, 8), (2048, 16), (4096, 32)])
def test_the_width_scales_with_the_budget_above_the_top_k_floor(budget, width):
    assert _memory(budget).recovery_width() == width


def test_top_k_zero_still_turns_similarity_recovery_off():
    assert _memory(4096, recovery_top_k=0).recovery_width() == 0


def test_zero_is_the_fixed_top_k():
    assert _memory(4096, recovery_width_tokens=0).recovery_width() == 8


def test_the_width_is_in_budget_tokens_not_block_sizes():
    assert _memory(200, block_tokens=16, recovery_top_k=4).recovery_width() == 4
    assert _memory(3000, recovery_top_k=4).recovery_width() == 8


def test_the_working_set_at_4096_holds_the_fact_ranked_twentieth():
    memory = _memory(4096)
    saved = [Block(name=f"b{i}", role="file", turn=1, tokens=list(range(10)), text=f"b{i}") for i in range(40)]
    for block in saved:
        block.state = BlockState.RAM
    rank = {block: i for i, block in enumerate(saved)}
    signal = SimpleNamespace(similarity=lambda b: -rank[b])
    working = ConversationMemory._working_set(memory, saved, [], signal)
    assert len(working) == 32 and saved[19] in working and saved[32] not in working


def _file_blocks(name: str, n: int) -> list[Block]:
    return [Block(name=f"{name}#{i}", role="file", turn=1, tokens=list(range(10)), text=f"{name} {i}",
                  file_name=name) for i in range(n)]


def test_a_file_hit_brings_its_neighbours_in_its_own_file_only():
    config, other = _file_blocks("config.yaml", 4), _file_blocks("app.py", 2)
    blocks = [*config, *other]
    extra = file_neighbours([config[1]], blocks, available=lambda b: True, limit=4)
    assert extra == [config[0], config[2]]


def test_neighbours_skip_hits_unavailable_blocks_and_stop_at_the_limit():
    config = _file_blocks("config.yaml", 5)
    chat = Block(name="chat", role="user", turn=1, tokens=list(range(10)), text="hi")
    extra = file_neighbours([config[2], config[3], chat], [*config, chat],
                            available=lambda b: b is not config[1], limit=1)
    assert extra == [config[4]]


def test_the_working_set_takes_a_hit_files_saved_neighbour_last_when_asked():
    config = _file_blocks("config.yaml", 3)
    fillers = [Block(name=f"f{i}", role="assistant", turn=1, tokens=list(range(10)), text=f"f{i}") for i in range(30)]
    saved = [*config, *fillers]
    for block in saved:
        block.state = BlockState.RAM
    score = {config[0]: 1.0, config[1]: -5.0, config[2]: -6.0, **{f: -i / 10 for i, f in enumerate(fillers)}}
    signal = SimpleNamespace(similarity=lambda b: score[b])
    plain = _memory(2048)
    plain.table = SimpleNamespace(blocks=saved)
    assert config[1] not in ConversationMemory._working_set(plain, saved, [], signal)
    grouped = _memory(2048, recovery_file_neighbours=True)
    grouped.table = SimpleNamespace(blocks=saved)
    working = ConversationMemory._working_set(grouped, saved, [], signal)
    assert working[config[1]] == 16 and config[2] not in working
