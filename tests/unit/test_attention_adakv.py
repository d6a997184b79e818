"""Ada-KV budget allocation (native/attention_capture.cpp) on hand-made weight matrices."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.attention_build import ensure_library

pytestmark = pytest.mark.unit      # the unit tier: no model loaded (make test-fast)


@pytest.fixture(scope="module")
def adakv():
    ensure_library()
    from evoke_engine.runtime import attention

    return attention.adakv


def _rows(*rows) -> np.ndarray:
    a = np.asarray(rows, dtype=np.float32)
    return a / a.sum(axis=1, keepdims=True)


def test_a_concentrated_head_gets_fewer_picks_than_a_flat_one(adakv):
    peaked = [0.91] + [0.01] * 9
    flat = [0.1] * 10
    picks, counts = adakv(_rows(peaked, flat), per_head_budget=5, alpha=0.2)
    assert picks.tolist() == [1, 9]                 # floor 1 each, the other 8 all to the flat head
    assert picks.sum() == 2 * 5 and counts.sum() == 10
    assert counts[0] >= 1                           # the peaked head spent its one pick on its peak


def test_budget_follows_concentration_across_three_heads(adakv):
    rng = np.random.default_rng(7)
    n = 64
    sharp = np.full(n, 1e-4) + np.eye(n)[3]                   # nearly all on one position
    medium = np.exp(-np.arange(n) / 4.0) + rng.random(n) * 1e-3
    flat = np.ones(n) + rng.random(n) * 1e-3
    picks, counts = adakv(_rows(sharp, medium, flat), per_head_budget=16, alpha=0.2)
    assert picks.sum() == 3 * 16
    assert picks[0] < picks[1] < picks[2]
    assert picks.min() >= int(0.2 * 16)
    assert counts.max() <= 3 and counts.sum() == 3 * 16


def test_floor_alpha_guarantees_every_head_its_share(adakv):
    rng = np.random.default_rng(3)
    n, budget = 100, 10
    diffuse = np.full(n, 0.01)                                  # every weight below the others' peaks
    focused_a = np.where(np.arange(n) < 20, 0.05, 0.0) + rng.random(n) * 1e-4
    focused_b = np.where(np.arange(n) >= 80, 0.05, 0.0) + rng.random(n) * 1e-4
    weights = _rows(diffuse, focused_a, focused_b)
    picks, _ = adakv(weights, per_head_budget=budget, alpha=0.2)
    assert picks[0] == 2                                        # floor(0.2 * 10), and no more
    assert picks.sum() == 3 * budget
    picks_no_floor, _ = adakv(weights, per_head_budget=budget, alpha=0.0)
    assert picks_no_floor[0] == 0                               # without the floor the diffuse head starves
    picks_uniform, _ = adakv(weights, per_head_budget=budget, alpha=1.0)
    assert picks_uniform.tolist() == [budget] * 3               # alpha 1 is the uniform allocation


def test_budget_larger_than_positions_picks_everything_once_per_head(adakv):
    picks, counts = adakv(_rows([1, 2, 3], [3, 2, 1]), per_head_budget=10, alpha=0.2)
    assert picks.tolist() == [3, 3]
    assert counts.tolist() == [2, 2, 2]
