"""Cutting a position range out of a one-sequence state blob: the cut equals the blob a save of those cells
alone would give (cells in the same order, K rows, V rows or transposed columns), for any K/V row size; unfit
bytes and ranges the blob does not hold whole raise UnfitState."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from helpers.state_blobs import N_LAYER, WIDTH, state_blob, tensors

from evoke_engine.kvcache import kvquant
from evoke_engine.kvcache.state_cells import UnfitState, cut, layout

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("seqs", [(3,), (0, 5)])
def test_the_cut_is_the_blob_of_those_cells_alone_in_cell_order(v_trans, seqs):
    positions = [40 + i for i in range(30)]
    order = np.random.default_rng(1).permutation(30)          # cell order is not position order
    positions = [positions[i] for i in order]
    k, v = tensors(30, seed=2)
    blob = state_blob(positions, k, v, v_trans=v_trans, seqs=seqs)
    p0, p1 = 47, 61
    picked = [i for i, pos in enumerate(positions) if p0 <= pos < p1]
    expected = state_blob([positions[i] for i in picked], k[:, picked], v[:, picked], v_trans=v_trans, seqs=seqs)
    assert cut(blob, p0, p1) == expected
    assert cut(blob, 40, 70) == blob                           # the whole range: the blob itself


def test_any_k_row_size_is_cut_whole_per_cell():
    positions = list(range(10, 26))
    k, v = tensors(16, seed=3, k_bytes=34)                      # q8_0: 34-byte blocks, not f16 values
    blob = state_blob(positions, k, v, v_trans=False, k_type=8)
    assert cut(blob, 12, 20) == state_blob(positions[2:10], k[:, 2:10], v[:, 2:10], v_trans=False, k_type=8)


def test_the_layout_walk_reads_positions_and_every_tensor():
    positions = list(range(5, 17))
    k, v = tensors(12, seed=4)
    found = layout(state_blob(positions, k, v, v_trans=True))
    assert found.n_cells == 12 and list(found.positions) == positions
    assert len(found.tensors) == 2 * N_LAYER and [t.transposed for t in found.tensors] == [False] * 3 + [True] * 3


@pytest.mark.parametrize("p0, p1", [(0, 8), (10, 30), (14, 14), (20, 12)])
def test_a_range_not_held_whole_raises(p0, p1):
    positions = list(range(10, 26))
    k, v = tensors(16, seed=5)
    with pytest.raises(UnfitState):
        cut(state_blob(positions, k, v, v_trans=False), p0, p1)


def test_a_position_held_twice_raises():
    positions = [10, 11, 12, 12, 13]
    k, v = tensors(5, seed=6)
    with pytest.raises(UnfitState, match="not each"):
        cut(state_blob(positions, k, v, v_trans=False), 10, 14)


def test_unfit_bytes_raise_and_never_return_a_half_cut():
    positions = list(range(10, 26))
    k, v = tensors(16, seed=7)
    blob = state_blob(positions, k, v, v_trans=True)
    for bad in (blob[:-1], blob + b"\0", blob[:40], b""):
        with pytest.raises(UnfitState):
            cut(bad, 12, 14)
    two_streams = bytearray(blob)
    struct.pack_into("<I", two_streams, 8, 2)
    with pytest.raises(UnfitState, match="streams"):
        cut(two_streams, 12, 14)


def test_packed_k_v_bytes_are_not_a_state():
    rng = np.random.default_rng(8)
    k, v = (rng.normal(0, 1, (N_LAYER, 16, WIDTH)).astype("<f2").view(np.uint8) for _ in range(2))
    packed = kvquant.pack(state_blob(list(range(10, 26)), k, v, v_trans=False))
    assert packed is not None
    with pytest.raises(UnfitState):
        cut(packed, 12, 14)
