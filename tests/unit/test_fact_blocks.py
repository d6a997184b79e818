"""A fact is in context only when every block holding part of its line is: the suite finds those blocks."""

from __future__ import annotations

import pytest

from benchmarks.recall_suite import _fact_blocks

pytestmark = pytest.mark.unit


def _blocks(*texts: str, turn: int = 1, role: str = "file") -> list[dict]:
    return [{"name": f"{role}#{turn}.{i}", "role": role, "turn": turn, "text": t} for i, t in enumerate(texts)]


def test_a_line_cut_between_two_blocks_needs_both():
    blocks = _blocks("noise line\nThe upload limit is ", "740 MB.\nmore noise\n", "tail\n")
    assert _fact_blocks(blocks, "The upload limit is 740 MB.") == {"file#1.0", "file#1.1"}


def test_a_whole_line_needs_its_one_block_and_other_messages_do_not_count():
    blocks = [*_blocks("The upload limit is 740 MB.\n", turn=1), *_blocks("unrelated\n", turn=2, role="user"),
              {"name": "assistant#1", "role": "assistant", "turn": 1, "text": "The upload limit is 740 MB."}]
    assert _fact_blocks(blocks, "The upload limit is 740 MB.") == {"file#1.0"}
    assert _fact_blocks(blocks, "not stated anywhere") == set()
