"""8- and 4-bit host storage of saved K/V: packing a state blob built in llama.cpp's one-sequence layout and back
(exact layout, bounded error, per-channel keys and per-token values, groups of 32 at 4 bits), unfit packed bytes
refused, and the host pool holding packed blocks (RAM and spill files) at about a half and a quarter of the bytes."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from evoke_engine.errors import RestoreError
from evoke_engine.kvcache import kvquant
from evoke_engine.kvcache.blocks import Block, BlockState
from evoke_engine.kvcache.pool import SavedPool
from evoke_engine.runtime import reanchor
from evoke_engine.runtime.kv import SavedKV

pytestmark = pytest.mark.unit      # the unit tier: no model loaded (make test-fast)

N_LAYER, N_HEAD_KV, HEAD_DIM = 3, 2, 16
GEOMETRY = reanchor.RopeGeometry(n_layer=N_LAYER, n_head_kv=N_HEAD_KV, head_dim=HEAD_DIM, n_rot=HEAD_DIM, mode=0,
                                 freq_base=10000.0, freq_scale=1.0)


def state_blob(n_cells: int, *, v_trans: bool, seed: int = 0, k_type: int = 1,
               k: np.ndarray | None = None, v: np.ndarray | None = None) -> bytearray:
    """A one-sequence state blob as llama_state_seq_get_data writes it; K and V [layer, cell, channel]."""
    rng = np.random.default_rng(seed)
    width = N_HEAD_KV * HEAD_DIM
    k = rng.normal(0, 3, (N_LAYER, n_cells, width)) if k is None else k
    v = rng.normal(0, 0.5, (N_LAYER, n_cells, width)) if v is None else v
    out = bytearray(struct.pack("<IIII", 0xA1B2, 2, 1, n_cells))
    for pos in range(n_cells):
        out += struct.pack("<iIi", 100 + pos, 1, 3)
    out += struct.pack("<II", int(v_trans), N_LAYER)
    for layer in range(N_LAYER):
        out += struct.pack("<iQ", k_type, width * 2) + k[layer].astype("<f2").tobytes()
    for layer in range(N_LAYER):
        if v_trans:
            out += struct.pack("<iII", 1, 2, width) + v[layer].T.astype("<f2").tobytes()
        else:
            out += struct.pack("<iQ", 1, width * 2) + v[layer].astype("<f2").tobytes()
    return out


def tensors(blob: bytes | bytearray) -> list[np.ndarray]:
    return [kvquant._matrix(blob, r).astype(np.float32) for r in kvquant.regions(blob)]


@pytest.mark.parametrize("v_trans", [True, False])
def test_the_walk_covers_every_k_and_v_tensor_and_agrees_with_the_reanchor_parse(v_trans):
    blob = state_blob(24, v_trans=v_trans)
    found = kvquant.regions(blob)
    assert len(found) == 2 * N_LAYER
    assert tuple(r.offset for r in found[:N_LAYER]) == reanchor.parse(blob, GEOMETRY).k_offsets
    assert found[-1].offset + found[-1].nbytes == len(blob)
    assert all(not r.per_row for r in found[:N_LAYER])                  # keys: one scale per channel
    assert [r.per_row for r in found[N_LAYER:]] == [not v_trans] * N_LAYER   # values: one per token


@pytest.mark.parametrize("v_trans", [True, False])
def test_round_trip_keeps_the_layout_byte_for_byte_and_each_value_within_half_a_step(v_trans):
    blob = state_blob(128, v_trans=v_trans, seed=3)
    packed = kvquant.pack(blob)
    assert kvquant.is_packed(packed) and not kvquant.is_packed(blob)
    assert 0.5 < len(packed) / len(blob) < 0.6
    back = kvquant.unpack(packed)
    assert len(back) == len(blob)
    found = kvquant.regions(blob)
    assert kvquant.regions(back) == found
    for start, end in kvquant._gaps(found, len(blob)):                 # headers, positions, sequence ids
        assert back[start:end] == blob[start:end]
    for region, before, after in zip(found, tensors(blob), tensors(back), strict=True):
        axis = 1 if region.per_row else 0
        step = (before.max(axis=axis, keepdims=True) - before.min(axis=axis, keepdims=True)) / 255
        bound = step * 0.5 * (1 + 2 ** -9) + np.abs(before) * 2 ** -10
        assert (np.abs(after - before) <= bound).all()


def test_keys_are_scaled_per_channel_and_values_per_token():
    width = N_HEAD_KV * HEAD_DIM
    rng = np.random.default_rng(1)
    k = rng.normal(0, 1, (N_LAYER, 64, width))
    v = rng.normal(0, 1, (N_LAYER, 64, width))
    k[:, :, 5] *= 500                        # an outlier channel (keys have them): the others keep their step
    v[:, 9, :] *= 500                        # an outlier token: the other tokens keep theirs
    for v_trans in (True, False):
        blob = state_blob(64, v_trans=v_trans, k=k, v=v)
        before, after = tensors(blob), tensors(kvquant.unpack(kvquant.pack(blob)))
        key_error = np.abs(after[0] - before[0])
        assert key_error[:, 5].max() > 1.0 and np.delete(key_error, 5, axis=1).max() < 0.02
        values_before, values_after = before[N_LAYER], after[N_LAYER]
        if v_trans:                          # [channel, cell]
            values_before, values_after = values_before.T, values_after.T
        value_error = np.abs(values_after - values_before)
        assert value_error[9].max() > 1.0 and np.delete(value_error, 9, axis=0).max() < 0.02


def test_a_constant_tensor_comes_back_exactly():
    width = N_HEAD_KV * HEAD_DIM
    blob = state_blob(16, v_trans=True, k=np.full((N_LAYER, 16, width), 0.75), v=np.zeros((N_LAYER, 16, width)))
    assert kvquant.unpack(kvquant.pack(blob)) == blob


def test_blobs_it_does_not_cover_are_not_packed():
    assert kvquant.pack(state_blob(8, v_trans=True, k_type=8)) is None          # a q8_0 cache
    blob = state_blob(8, v_trans=False)
    assert kvquant.pack(blob[:-2]) is None                                      # the walk must end at the end
    assert kvquant.pack(blob + b"\0\0") is None
    k = np.zeros((N_LAYER, 8, N_HEAD_KV * HEAD_DIM))
    k[1, 2, 3] = np.inf
    assert kvquant.pack(state_blob(8, v_trans=False, k=k)) is None
    assert kvquant.pack(b"\1\2\3") is None


def _corrupt(packed: bytes, at: int, data: bytes) -> bytes:
    return packed[:at] + data + packed[at + len(data):]


def test_packed_bytes_that_do_not_fit_are_refused():
    packed = kvquant.pack(state_blob(32, v_trans=True))
    head, region = kvquant._HEAD.size, kvquant._REGION.size
    unfit = {
        "truncated": packed[:-1],
        "longer": packed + b"\0",
        "header only": packed[:10],
        "other format": _corrupt(packed, 0, b"EVKVQ9"),
        "more rows": _corrupt(packed, head + 8, struct.pack("<I", 33)),
        "overlapping": _corrupt(packed, head + region, struct.pack("<Q", 16)),
        "shorter blob": _corrupt(packed, 8, struct.pack("<Q", len(state_blob(32, v_trans=True)) - 2)),
        "nan step": _corrupt(packed, len(packed) - 32 * 32 - 2 * 32 + 2, b"\xff\x7f"),   # last V: 2nd step
    }
    for what, data in unfit.items():
        with pytest.raises(kvquant.UnfitPacked):
            kvquant.unpack(data)
            pytest.fail(what)
    assert kvquant.unpack(packed) is not None


def block(name: str, role: str = "file") -> Block:
    return Block(name=name, role=role, turn=1, tokens=[1, 2, 3, 4], text=name)


def test_the_pool_holds_8_bit_blocks_at_about_half_the_bytes_in_ram_and_spill_files(tmp_path):
    blobs = [state_blob(128, v_trans=True, seed=s) for s in range(3)]
    full = SavedPool(1 << 30, tmp_path / "16")
    half = SavedPool(1 << 30, tmp_path / "8", bits=8)
    blocks = [block(f"b{i}") for i in range(3)]
    for b, blob in zip(blocks, blobs, strict=True):
        full.put(b, SavedKV(bytearray(blob), origin_pos=40, n_tokens=128))
    for b, blob in zip(blocks, blobs, strict=True):
        half.put(b, SavedKV(bytearray(blob), origin_pos=40, n_tokens=128))
    assert 0.5 < half.ram_bytes / full.ram_bytes < 0.6            # 32 channels: scales weigh more than at 192
    assert half.nbytes(blocks[0]) == half.ram_bytes // 3
    half.set_budget(half.nbytes(blocks[0]))                        # two spill as packed files
    assert [half.where(b) for b in blocks] == [BlockState.DISK, BlockState.DISK, BlockState.RAM]
    assert half.spill_bytes == 2 * half.nbytes(blocks[2]) == half.disk_bytes()
    assert sorted(p.suffix for p in half.spill_dir.glob("*.kv*")) == [".kvq", ".kvq"]
    for b, blob in zip(blocks, blobs, strict=True):
        data, origin, n_tokens = half.peek_bytes(b)
        back = half.take(b)
        assert bytes(back.data) == data and len(data) == len(blob)
        assert (back.origin_pos, back.n_tokens, origin, n_tokens) == (40, 128, 40, 128)
        assert kvquant.regions(back.data) == kvquant.regions(blob)
    assert half.ram_bytes == half.spill_bytes == 0
    full.close()
    half.close()


def test_the_pool_keeps_what_8_bits_does_not_cover_as_it_is(tmp_path):
    pool = SavedPool(1 << 30, tmp_path, bits=8)
    q8 = state_blob(16, v_trans=True, k_type=8)
    image = state_blob(16, v_trans=True)
    pool.put(block("q8"), SavedKV(bytearray(q8), 0, 16))
    pool.put(block("image", role="image"), SavedKV(bytearray(image), 0, 16))
    assert pool.ram_bytes == len(q8) + len(image)
    pool.set_bits(4)
    pool.put(block("q8 at 4"), SavedKV(bytearray(q8), 0, 16))
    assert pool.ram_bytes == 2 * len(q8) + len(image)
    pool.set_bits(16)
    with pytest.raises(ValueError, match="pool bits"):
        pool.set_bits(2)
    pool.close()


def test_a_packed_spill_file_that_does_not_fit_is_a_restore_error_and_the_entry_is_gone(tmp_path):
    pool = SavedPool(0, tmp_path, bits=8)
    b = block("a")
    pool.put(b, SavedKV(state_blob(32, v_trans=False), 0, 32))
    path = next(pool.spill_dir.glob("*.kvq"))
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(RestoreError, match="do not fit"):
        pool.take(b)
    assert pool.where(b) is None and b not in pool and pool.spill_bytes == 0
    pool.close()


def _bound(before: np.ndarray, region: kvquant.Region, bits: int) -> np.ndarray:
    """Half a step of each value's group (plus f16 rounding), in the tensor's own layout."""
    grouped = kvquant._lines(before, region.grouped(bits))
    span = grouped.max(axis=2, keepdims=True) - grouped.min(axis=2, keepdims=True)
    step = np.broadcast_to(span / ((1 << bits) - 1), grouped.shape)
    return kvquant._unlined(step, region.grouped(bits)) * 0.5 * (1 + 2 ** -9) + np.abs(before) * 2 ** -10


@pytest.mark.parametrize("v_trans", [True, False])
@pytest.mark.parametrize("n_cells", [128, 37])
def test_4_bit_round_trip_keeps_the_layout_and_each_value_within_half_a_step_of_its_group(v_trans, n_cells):
    blob = state_blob(n_cells, v_trans=v_trans, seed=5)
    packed = kvquant.pack(blob, 4)
    assert kvquant.bits_of(packed) == 4 and kvquant.bits_of(kvquant.pack(blob)) == 8
    back = kvquant.unpack(packed)
    found = kvquant.regions(blob)
    assert kvquant.regions(back) == found
    for start, end in kvquant._gaps(found, len(blob)):
        assert back[start:end] == blob[start:end]
    for region, before, after in zip(found, tensors(blob), tensors(back), strict=True):
        assert (np.abs(after - before) <= _bound(before, region, 4)).all()
    # 128 tokens: keys grouped 32 tokens per channel; 37 tokens: one group per channel (32 does not divide)
    key_groups = 4 if n_cells == 128 else 1
    assert kvquant.regions(blob)[0].grouped(4).n_scales == N_HEAD_KV * HEAD_DIM * key_groups


def test_4_bit_is_about_a_quarter_of_the_bytes_and_groups_keep_an_outlier_local():
    width = N_HEAD_KV * HEAD_DIM
    rng = np.random.default_rng(2)
    k = rng.normal(0, 1, (N_LAYER, 128, width))
    k[:, 9, 3] = 300                         # one outlier key: only its group (tokens 0-31 of channel 3) pays
    blob = state_blob(128, v_trans=False, k=k)
    packed = kvquant.pack(blob, 4)
    assert 0.25 < len(packed) / len(blob) < 0.4       # 32 channels: the scales of every group weigh
    error = np.abs(tensors(kvquant.unpack(packed))[0] - tensors(blob)[0])     # layer 0 keys [token, channel]
    assert error[:32, 3].max() > 1 and error[32:, 3].max() < 0.6 and np.delete(error, 3, axis=1).max() < 0.6


def test_4_bit_packed_bytes_that_do_not_fit_are_refused():
    blob = state_blob(64, v_trans=True)
    packed = kvquant.pack(blob, 4)
    head, region = kvquant._HEAD.size, kvquant._REGION.size
    unfit = {
        "truncated": packed[:-1],
        "read as 8-bit": _corrupt(packed, 0, kvquant.magic(8)),
        "group that does not divide": _corrupt(packed, head + 20, struct.pack("<I", 24)),
        "no group at 4 bits": _corrupt(packed, head + region + 20, struct.pack("<I", 0)),
    }
    for what, data in unfit.items():
        with pytest.raises(kvquant.UnfitPacked):
            kvquant.unpack(data)
            pytest.fail(what)
    with pytest.raises(ValueError, match="bits"):
        kvquant.pack(blob, 3)


def test_the_pool_holds_4_bit_blocks_in_ram_and_spill_files(tmp_path):
    blobs = [state_blob(128, v_trans=True, seed=s) for s in range(2)]
    pool = SavedPool(1 << 30, tmp_path, bits=4)
    blocks = [block(f"b{i}") for i in range(2)]
    for b, blob in zip(blocks, blobs, strict=True):
        pool.put(b, SavedKV(bytearray(blob), origin_pos=7, n_tokens=128))
    assert pool.ram_bytes < 0.4 * sum(map(len, blobs))
    pool.set_budget(0)
    assert [pool.where(b) for b in blocks] == [BlockState.DISK, BlockState.DISK]
    for b, blob in zip(blocks, blobs, strict=True):
        back = pool.take(b)
        assert len(back.data) == len(blob) and kvquant.regions(back.data) == kvquant.regions(blob)
    pool.close()
