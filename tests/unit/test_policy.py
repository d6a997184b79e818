"""Eviction and recovery decisions, and the scorer, on plain objects (no model)."""

from __future__ import annotations

import numpy as np
import pytest

from evoke_engine.errors import InvariantError
from evoke_engine.kvcache.blocks import Block, BlockState, BlockTable
from evoke_engine.memory.policy import choose_recoveries, choose_victims, named_in, protected_blocks
from evoke_engine.memory.scorer import Scorer, TaskFocus
from evoke_engine.settings import Settings

pytestmark = pytest.mark.unit      # the unit tier: no model loaded (make test-fast)


def block(name: str, n: int, role: str = "file", turn: int = 1, **kw) -> Block:
    return Block(name=name, role=role, turn=turn, tokens=list(range(n)), text=name, **kw)


def table_of(*blocks: Block) -> BlockTable:
    table = BlockTable()
    for b in blocks:
        table.append(b)
    return table


def test_positions_stay_contiguous_when_blocks_leave():
    a, b, c = block("a", 10), block("b", 20), block("c", 30)
    table = table_of(a, b, c)
    assert table.remove_resident(b, BlockState.RAM) == (10, 30)
    assert (a.pos, c.pos, table.active_tokens) == (0, 10, 40)
    table.place_at_tail(b)
    assert b.pos == 40 and b.state is BlockState.RESIDENT
    table.check()


def test_shared_blocks_cannot_leave():
    system = block("system", 10, role="system", shared=True)
    table = table_of(system, block("x", 10))
    with pytest.raises(AssertionError):
        table.remove_resident(system, BlockState.RAM)


def test_protection_covers_prefix_sink_pins_current_and_tail():
    system = block("system", 10, role="system", shared=True)
    pinned = block("pinned", 10, pinned=True)
    mid, current, tail = block("mid", 40), block("cur", 10), block("tail", 20)
    table = table_of(system, pinned, mid, current, tail)
    keep = protected_blocks(table, tail_tokens=15, current=[current])
    assert keep == {system, pinned, current, tail}


def test_sink_is_the_first_block_without_a_prefix():
    first, other = block("user#1", 10, role="user"), block("x", 10)
    table = table_of(first, other, block("y", 10))
    assert first in protected_blocks(table, tail_tokens=0)


def test_victims_are_lowest_scored_until_target():
    blocks = [block(f"b{i}", 10) for i in range(6)]
    table = table_of(*blocks)
    scores = {"b0": 0.9, "b1": 0.1, "b2": 0.5, "b3": 0.2, "b4": 0.8, "b5": 0.0}
    victims = choose_victims(table, target_tokens=35, protected={blocks[5]}, score=lambda b: scores[b.name])
    assert [v.name for v in victims] == ["b1", "b3", "b2"]


def test_no_victims_under_target():
    table = table_of(block("a", 10))
    assert choose_victims(table, target_tokens=10, protected=set(), score=lambda b: 0) == []


def test_named_in_matches_file_names_not_substrings():
    b = block("file:src/config.py#0", 10, file_name="src/config.py")
    assert named_in("what does config.py set?", b)
    assert named_in("look at `config.py`", b)
    assert not named_in("myconfig.pyc is unrelated", b)
    assert not named_in("config", b)


def test_recovery_order_gate_and_room():
    similar = {"hit": 0.9, "weak": 0.1, "named": 0.0, "same": 0.2, "big": 0.95}
    saved = [block("hit", 50), block("weak", 50), block("named", 50, file_name="notes.md"),
             block("same", 50), block("big", 500)]
    saved[3].hash = "h-same"
    picks = choose_recoveries(saved, message="see notes.md", similarity=lambda b: similar[b.name],
                              resident_best={"file": 0.5}, top_k=3, room_tokens=160,
                              identity_hashes={"h-same"})
    assert [(p.block.name, p.reason) for p in picks] == [("same", "identity"), ("named", "named"),
                                                        ("hit", "similar")]


def test_resident_gate_compares_like_with_like():
    saved = [block("doc", 50)]
    picks = choose_recoveries(saved, message="q", similarity=lambda b: 0.3,
                              resident_best={"user": 0.9, "file": 0.1}, top_k=4, room_tokens=100)
    assert [p.block.name for p in picks] == ["doc"]
    picks = choose_recoveries(saved, message="q", similarity=lambda b: 0.3,
                              resident_best={"file": 0.4}, top_k=4, room_tokens=100)
    assert picks == []


def unit(*values: float) -> np.ndarray:
    v = np.array(values, dtype=np.float32)
    return v / np.linalg.norm(v)


def test_scorer_floors_pins_priority():
    scorer = Scorer(Settings(home="/tmp/unused-home"))
    query = unit(1, 0)
    far = unit(0, 1)
    user = block("user#1", 5, role="user", turn=1)
    user.embedding = far
    doc = block("file:a#0", 5, turn=1)
    doc.embedding = far
    pinned = block("file:b#0", 5, turn=1, pinned=True)
    assert scorer.score(user, query=query, focus=None, current_turn=20) == pytest.approx(0.6)
    assert scorer.score(doc, query=query, focus=None, current_turn=20) < 0.1
    assert scorer.score(pinned, query=query, focus=None, current_turn=20) == 1.0
    doc.embedding = query
    base = scorer.score(doc, query=query, focus=None, current_turn=1)
    doc.priority = 0.5
    assert scorer.score(doc, query=query, focus=None, current_turn=1) == pytest.approx(base * 0.5)


def test_task_focus_moves_by_ema_and_snaps_on_topic_shift():
    focus = TaskFocus(ema=0.3, snap_cosine=0.3)
    focus.update(unit(1, 0, 0))
    focus.update(unit(1, 0.2, 0))
    assert focus.snaps == 1 and focus.vector[1] > 0
    focus.update(unit(0, 0, 1))
    assert focus.snaps == 2 and np.allclose(focus.vector, unit(0, 0, 1))


def test_every_recovery_setting_names_one_strategy_and_a_wrong_name_lists_the_valid_ones():
    from evoke_engine.memory.recovery import BACKENDS, backend
    from evoke_engine.settings import RECOVERY_BACKENDS

    assert tuple(BACKENDS) == RECOVERY_BACKENDS
    assert [backend(name).name for name in RECOVERY_BACKENDS] == list(RECOVERY_BACKENDS)
    assert [name for name in RECOVERY_BACKENDS if not backend(name).evicts] == ["none"]
    assert [name for name in RECOVERY_BACKENDS if backend(name).keeps_bytes] == ["kv_restore"]
    with pytest.raises(ValueError, match="kv_restore, breadcrumb, discard, none"):
        backend("restore")


def test_the_table_splits_a_resident_block_in_place_and_rebuilds_from_blocks():
    table = BlockTable()
    system = table.append(Block(name="system", role="system", turn=0, tokens=[1, 2], text="s", shared=True))
    reply = table.append(Block(name="assistant#1", role="assistant", turn=1, tokens=[3, 4, 5], text="r"))
    tail = table.append(Block(name="user#2", role="user", turn=2, tokens=[6], text="u"))
    pieces = [Block(name="assistant#1", role="assistant", turn=1, tokens=[3, 4], text="r"),
              Block(name="assistant#1.1", role="assistant", turn=1, tokens=[5], text="")]
    table.split(reply, pieces)
    assert [(b.name, b.pos) for b in table.resident] == [("system", 0), ("assistant#1", 2), ("assistant#1.1", 4),
                                                         ("user#2", 5)]
    with pytest.raises(InvariantError):
        table.split(tail, [Block(name="user#2", role="user", turn=2, tokens=[7], text="")])
    table.remove_resident(pieces[1], BlockState.RAM)
    copy = BlockTable.from_blocks([b.clone() for b in table.blocks])
    assert [b.name for b in copy.resident] == ["system", "assistant#1", "user#2"] and copy.active_tokens == 5
    assert [b.pos for b in copy.blocks] == [0, 2, None, 4] and system.pos == 0
