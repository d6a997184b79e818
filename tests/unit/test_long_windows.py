"""`bench long`'s flatness windows (issue 44): the reference window ends before the last five turns begin at every
length, the quick run's 22 turns included, and the summary names the turns of both."""

from __future__ import annotations

import pytest

from benchmarks.long import COMPARABLE, summarize, window_turns

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("n_turns", [6, 10, 12, 22, 25, 40, 80])
def test_the_reference_window_ends_before_the_last_five_begin(n_turns):
    reference, end = window_turns(list(range(1, n_turns + 1)))
    assert end == list(range(n_turns - 4, n_turns + 1))
    assert reference and max(reference) < min(end)
    assert len(reference) == min(5, n_turns - 5)


def test_a_long_run_keeps_turn_20_as_its_reference():
    assert window_turns(list(range(1, 61))) == ([18, 19, 20, 21, 22], [56, 57, 58, 59, 60])


def test_a_run_of_five_turns_or_fewer_has_no_reference():
    assert window_turns([1, 2, 3, 4, 5]) == ([], [1, 2, 3, 4, 5])


def test_the_quick_runs_summary_names_two_windows_of_different_turns():
    rows = [{"turn": t, "kind": COMPARABLE[0], "ttft_s": 0.1 * t, "decode_tok_s": 50.0 - t}
            for t in range(1, 23)]
    ttft = summarize("evoke", rows, {"kind": "server"}, None)["ttft_s"]
    assert ttft["near_turn_20_turns"] == [13, 14, 15, 16, 17] and ttft["last_five_turns"] == [18, 19, 20, 21, 22]
    assert ttft["end_over_turn_20"] != 1.0
