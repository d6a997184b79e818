"""The held-ahead rules (`runtime/held_ahead.HeldAhead`) that the real KV cache and the fake share, on plain objects:
a run is claimed by the decode that starts with it, dropped by any other operation on its sequence, and moved by a
compaction below it."""

from __future__ import annotations

import pytest

from evoke_engine.runtime.held_ahead import HeldAhead

pytestmark = pytest.mark.unit


@pytest.fixture
def held():
    removed: list[tuple[int, int]] = []
    rules = HeldAhead(lambda seq, p0: removed.append((seq, p0)))
    rules.removed = removed
    return rules


def test_a_decode_that_starts_with_the_run_claims_it_and_leaves_one_token_to_decode(held):
    held.hold(1, 40, [7, 8, 9])
    assert held.claim(1, 40, [7, 8, 9, 10]) == 3 and held.claimed == 3
    assert held.tokens(1) == [] and held.removed == []
    held.hold(1, 40, [7, 8, 9])
    assert held.claim(1, 40, [7, 8, 9]) == 0, "the last token's logits are wanted: it is decoded again"
    assert held.removed == [(1, 40)]
    held.hold(1, 40, [7, 8, 9])
    assert held.claim(1, 40, [7, 8, 9], whole=True) == 3


def test_a_run_that_does_not_match_is_dropped_with_its_cells(held):
    held.hold(2, 10, [1, 2])
    assert held.claim(2, 11, [1, 2, 3]) == 0 and held.removed == [(2, 10)]
    held.hold(2, 10, [1, 2])
    assert held.claim(2, 10, [1, 5, 3]) == 0 and held.removed[-1] == (2, 10)
    assert held.claim(2, 10, [1, 2, 3]) == 0, "nothing is held any more"


def test_a_compaction_below_the_run_moves_it_and_any_other_eviction_drops_it(held):
    held.hold(0, 100, [4, 5])
    held.evicted(0, 20, 50, compact=True)
    assert held.claim(0, 70, [4, 5, 6]) == 2
    held.hold(0, 100, [4, 5])
    held.evicted(0, 20, 50, compact=False)
    assert held.tokens(0) == [] and held.removed == [(0, 100)]
    held.hold(0, 100, [4, 5])
    held.evicted(0, 90, 102, compact=True)
    assert held.tokens(0) == [] and held.removed[-1] == (0, 100)


def test_sharing_over_the_run_drops_it_and_the_destination_loses_its_own(held):
    held.hold(3, 50, [1])
    held.hold(4, 60, [2])
    held.shared(3, 4, 50)                       # a range below the run: the source keeps it
    assert held.tokens(3) == [1] and held.tokens(4) == [] and held.removed == [(4, 60)]
    held.shared(3, 5, -1)                       # everything: the copy would carry the run
    assert held.tokens(3) == [] and held.removed[-1] == (3, 50)
    held.hold(6, 5, [9])
    held.forget(6)
    held.hold(6, 5, [])
    assert held.tokens(6) == [] and held.removed[-1] == (6, 5)


def test_a_block_spliced_in_at_the_run_moves_its_opening_up_and_drops_the_words_after_it():
    removed, moved = [], []
    held = HeldAhead(lambda seq, p0: removed.append((seq, p0)), move=lambda seq, p0, d: moved.append((seq, p0, d)))
    held.hold(0, 100, [1, 2, 3, 40, 41], opening=3)          # the role header, then two words of a draft
    assert held.make_room(0, 100, 25)
    assert removed == [(0, 103)] and moved == [(0, 100, 25)] and held.moved == 1
    assert held.tokens(0) == [1, 2, 3] and held.opening(0) == 3
    assert held.claim(0, 125, [1, 2, 3, 40]) == 3, "the decode after the block claims the moved opening"


def test_a_run_without_an_opening_or_elsewhere_or_without_a_move_is_forgotten_by_a_splice(held):
    held.hold(0, 100, [40, 41])                               # a draft alone: its words never saw the block
    assert not held.make_room(0, 100, 25) and held.removed == [(0, 100)]
    held.hold(0, 100, [1, 2, 3], opening=3)
    assert not held.make_room(0, 90, 5), "a splice below the run, not at it"
    assert held.removed[-1] == (0, 100) and held.tokens(0) == []
    held.hold(0, 100, [1, 2, 3], opening=3)                   # `held` has no `move`: nothing can move
    assert not held.make_room(0, 100, 5) and held.tokens(0) == []
    assert not held.make_room(7, 0, 5), "nothing held: nothing to do"
