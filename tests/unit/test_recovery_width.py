"""Adaptive recovery width (`recovery_margin`): one block when the top is clearly ahead, more when close."""

from __future__ import annotations

import pytest

from evoke_engine.kvcache.blocks import Block
from evoke_engine.memory.policy import choose_recoveries

pytestmark = pytest.mark.unit


def _block(name: str, role: str = "file", n: int = 10) -> Block:
    return Block(name=name, role=role, turn=1, tokens=list(range(n)), text=name)


def _choose(scores: dict[str, float], blocks: list[Block], *, margin: float | None, resident_best=None,
            top_k: int = 4, room: int = 1000) -> list[str]:
    picks = choose_recoveries(blocks, message="q", similarity=lambda b: scores[b.name],
                              resident_best=resident_best or {}, top_k=top_k, room_tokens=room, margin=margin)
    return [p.block.name for p in picks]


def test_a_clear_leader_comes_back_alone():
    blocks = [_block(n) for n in "abc"]
    assert _choose({"a": 0.70, "b": 0.50, "c": 0.40}, blocks, margin=0.05) == ["a"]


def test_close_scores_come_back_together_up_to_top_k():
    blocks = [_block(n) for n in "abcd"]
    scores = {"a": 0.70, "b": 0.69, "c": 0.68, "d": 0.30}
    assert _choose(scores, blocks, margin=0.05) == ["a", "b", "c"]
    assert _choose(scores, blocks, margin=0.05, top_k=2) == ["a", "b"]


def test_a_better_resident_block_of_any_role_holds_the_saved_ones_back():
    blocks = [_block(n) for n in "ab"]
    scores = {"a": 0.50, "b": 0.48}
    assert _choose(scores, blocks, margin=0.05, resident_best={"assistant": 0.80}) == []
    assert _choose(scores, blocks, margin=0.05, resident_best={"assistant": 0.52}) == ["a", "b"]


def test_without_a_margin_the_per_role_gate_decides():
    blocks = [_block("a"), _block("b", role="user")]
    scores = {"a": 0.50, "b": 0.48}
    assert _choose(scores, blocks, margin=None, resident_best={"file": 0.60, "user": 0.40}) == ["b"]
    assert _choose(scores, blocks, margin=-1.0, resident_best={"file": 0.60, "user": 0.40}) == ["b"]


def test_the_room_still_bounds_a_wide_recovery():
    blocks = [_block(n, n=30) for n in "abc"]
    assert _choose({"a": 0.7, "b": 0.7, "c": 0.7}, blocks, margin=0.1, room=65) == ["a", "b"]
