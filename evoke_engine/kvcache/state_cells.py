"""Cutting the cells of a position range out of a one-sequence llama.cpp state blob (a slot image), as bytes equal
to what saving that range of the live sequence gives (`KVCache.save`: the same cells, in the same cell order).

Invariants: pure (reads its input, returns new bytes); the whole blob is walked and must end exactly at its last
byte; the cut holds every position of [p0, p1) exactly once, or `UnfitState` is raised and nothing is returned.
Any K and V type is cut (K rows, and V rows or transposed V columns, are whole per cell).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

Buffer = bytes | bytearray | memoryview
_HEAD = struct.Struct("<IIII")            # magic, version, n_stream, n_cells
_LAYERS = struct.Struct("<II")            # v_trans, n_layer
_ROW = struct.Struct("<iQ")               # type, bytes per cell (K, and V not transposed)
_TRANSPOSED = struct.Struct("<iII")       # type, bytes per element, n_embd_v (V transposed)
MAX_LAYERS = 4096


class UnfitState(ValueError):
    """Bytes that are not a one-sequence state blob this module can walk, or a range it does not hold whole."""


@dataclass(frozen=True)
class _Tensor:
    header: bytes        # the type and size fields before the data
    offset: int          # where the data start
    rows: int            # K / V rows: n_cells rows of `width` bytes; transposed V: n_embd_v rows of n_cells elements
    width: int           # bytes per row (rows), bytes per element (transposed)
    transposed: bool


@dataclass(frozen=True)
class StateLayout:
    """Where the parts of a one-sequence state blob are."""

    n_cells: int
    positions: np.ndarray            # per cell, in cell order
    records: list[tuple[int, int]] | None   # per cell: (offset, length) of its record; None: all 12 bytes from 16
    v_trans: int
    n_layer: int
    tensors: list[_Tensor]           # K of every layer, then V of every layer


def _need(condition: bool, reason: str) -> None:
    if not condition:
        raise UnfitState(reason)


def _cells(blob: Buffer, n_cells: int) -> tuple[np.ndarray, list[tuple[int, int]] | None, int]:
    """Positions and record spans of every cell (None: one sequence per cell, 12 bytes each, the usual case,
    read in one numpy pass), and the offset after them."""
    end = _HEAD.size + 12 * n_cells
    if end <= len(blob):
        fixed = np.frombuffer(blob, dtype="<i4", count=3 * n_cells, offset=_HEAD.size).reshape(n_cells, 3)
        if (fixed[:, 1] == 1).all():
            return fixed[:, 0].astype(np.int64), None, end
    positions, records, offset = [], [], _HEAD.size
    for _ in range(n_cells):
        pos, n_seq = struct.unpack_from("<iI", blob, offset)
        _need(n_seq <= 1024, f"a cell of {n_seq} sequences")
        records.append((offset, 8 + 4 * n_seq))
        positions.append(pos)
        offset += 8 + 4 * n_seq
    return np.asarray(positions, dtype=np.int64), records, offset


def layout(blob: Buffer) -> StateLayout:
    """The layout of a one-sequence state blob (u32 magic, version, n_stream = 1, n_cells; per cell i32 pos, u32
    n_seq and n_seq i32 ids; u32 v_trans, u32 n_layer; per layer i32 K type, u64 row bytes and n_cells rows; per
    layer V: rows as K, or (v_trans) i32 type, u32 element bytes, u32 n_embd_v and n_embd_v rows of n_cells
    elements). UnfitState when the walk does not end at the blob's last byte."""
    try:
        _magic, _version, n_stream, n_cells = _HEAD.unpack_from(blob, 0)
        _need(n_stream == 1, f"a state of {n_stream} streams (one sequence, one stream expected)")
        _need(n_cells > 0 and _HEAD.size + 8 * n_cells <= len(blob), f"{n_cells} cells in {len(blob)} bytes")
        positions, records, offset = _cells(blob, n_cells)
        v_trans, n_layer = _LAYERS.unpack_from(blob, offset)
        offset += _LAYERS.size
        _need(v_trans in (0, 1) and 0 < n_layer <= MAX_LAYERS, f"v_trans {v_trans}, {n_layer} layers")
        tensors: list[_Tensor] = []
        for index in range(2 * n_layer):
            if index >= n_layer and v_trans:
                v_type, element, n_embd_v = _TRANSPOSED.unpack_from(blob, offset)
                _need(element > 0 and n_embd_v > 0, f"V of layer {index - n_layer}: {element}-byte elements, "
                                                   f"{n_embd_v} rows")
                tensors.append(_Tensor(bytes(blob[offset:offset + _TRANSPOSED.size]), offset + _TRANSPOSED.size,
                                       n_embd_v, element, transposed=True))
                offset += _TRANSPOSED.size + n_embd_v * n_cells * element
            else:
                _type, row = _ROW.unpack_from(blob, offset)
                _need(row > 0, f"{'KV'[index >= n_layer]} of layer {index % n_layer}: empty rows")
                tensors.append(_Tensor(bytes(blob[offset:offset + _ROW.size]), offset + _ROW.size, n_cells, row,
                                       transposed=False))
                offset += _ROW.size + n_cells * row
            _need(offset <= len(blob), f"the tensors run past the blob's {len(blob)} bytes")
    except struct.error as exc:
        raise UnfitState(f"truncated state ({len(blob)} bytes): {exc}") from exc
    _need(offset == len(blob), f"the state's cells and tensors account for {offset} of {len(blob)} bytes")
    return StateLayout(n_cells, positions, records, v_trans, n_layer, tensors)


def cut(blob: Buffer, p0: int, p1: int) -> bytearray:
    """The state of the cells of `blob` at positions [p0, p1), in `blob`'s cell order: byte for byte what
    `KVCache.save(seq, p0, p1)` returns for the sequence `blob` was saved from. UnfitState for bytes that are
    not a one-sequence state, or when [p0, p1) is empty or not held once each."""
    _need(p1 > p0, f"an empty range [{p0}, {p1})")
    found = layout(blob)
    picked = np.flatnonzero((found.positions >= p0) & (found.positions < p1))
    held = np.sort(found.positions[picked])
    _need(len(held) == p1 - p0 and bool((held == np.arange(p0, p1)).all()),
          f"the state holds {len(held)} cells in [{p0}, {p1}), not each of its {p1 - p0} positions once")
    source = memoryview(blob).cast("B")
    n_cells, count = found.n_cells, len(picked)
    out = bytearray(source[:_HEAD.size - 4])
    out += struct.pack("<I", count)
    if found.records is None:
        cells = np.frombuffer(blob, dtype=np.uint8, count=12 * n_cells, offset=_HEAD.size).reshape(n_cells, 12)
        out += cells[picked].tobytes()
    else:
        for i in picked:
            offset, length = found.records[i]
            out += source[offset:offset + length]
    out += _LAYERS.pack(found.v_trans, found.n_layer)
    for tensor in found.tensors:
        out += tensor.header
        if tensor.transposed:
            data = np.frombuffer(blob, dtype=np.uint8, count=tensor.rows * n_cells * tensor.width,
                                 offset=tensor.offset).reshape(tensor.rows, n_cells, tensor.width)
            out += data[:, picked, :].tobytes()
        else:
            data = np.frombuffer(blob, dtype=np.uint8, count=n_cells * tensor.width,
                                 offset=tensor.offset).reshape(n_cells, tensor.width)
            out += data[picked].tobytes()
    return out
