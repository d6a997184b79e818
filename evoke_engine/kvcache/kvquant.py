"""8-bit host storage of saved K/V bytes: pack a sequence-state blob's f16 K and V to uint8, unpack to the blob.

Owns the packed format and the walk of every K and V tensor of a one-sequence state blob (reanchor.parse
finds the K rows only). KIVI-style: keys per channel (min and step over the block's tokens), values per
token, per layer, with f16 minimum and step. Invariants: `unpack(pack(blob))` has the exact length and
every byte outside the K/V data of `blob` (headers, positions, sequence ids); each value is within half a
step (plus the f16 rounding of the result) of the original; `pack` returns None for anything it does not
cover (a q8_0 cache, non-finite values, an unknown layout) and the caller keeps those bytes as they are;
`unpack` raises UnfitPacked for packed bytes whose header, shapes or scales do not fit, writing nothing.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

MAGIC = b"EVKVQ8\x01\x00"             # format 1, 8 bits
_HEAD = struct.Struct("<8sQI")          # magic, unpacked length, region count
_REGION = struct.Struct("<QIII")        # offset, rows, cols, per_row
_GGML_TYPE_F16 = 1
LEVELS = 255


class UnfitPacked(ValueError):
    """Packed K/V bytes that do not describe a blob this module wrote (corrupt, truncated, other format)."""


@dataclass(frozen=True)
class Region:
    """An f16 matrix of `rows` x `cols` at `offset`; one (minimum, step) per row when `per_row`, else per column."""

    offset: int
    rows: int
    cols: int
    per_row: bool

    @property
    def nbytes(self) -> int:
        return self.rows * self.cols * 2

    @property
    def n_scales(self) -> int:
        return self.rows if self.per_row else self.cols


@dataclass
class PackedKV:
    """A SavedKV's bytes packed by `pack`; `nbytes` is what the host pool holds for it."""

    data: bytes
    origin_pos: int
    n_tokens: int

    @property
    def nbytes(self) -> int:
        return len(self.data)


def regions(blob: bytes | bytearray | memoryview) -> list[Region] | None:
    """Every per-layer K and V tensor of a one-sequence state blob with an f16 cache, or None.

    Layout (llama_state_seq_get_data, one stream): u32 magic, u32 version, u32 n_stream, u32 n_cells; per
    cell i32 pos, u32 n_seq, n_seq x i32 seq; u32 v_trans, u32 n_layer; per layer i32 k_type, u64 row bytes,
    n_cells rows; then per layer either (v_trans) i32 v_type, u32 element bytes, u32 n_embd_v and n_embd_v
    x n_cells elements, or i32 v_type, u64 row bytes and n_cells rows. The walk must end at the blob's end."""
    try:
        _magic, _version, n_stream, n_cells = struct.unpack_from("<IIII", blob, 0)
        if n_stream != 1 or n_cells == 0:
            return None
        offset = 16
        for _ in range(n_cells):
            _pos, n_seq = struct.unpack_from("<iI", blob, offset)
            offset += 8 + 4 * n_seq
        v_trans, n_layer = struct.unpack_from("<II", blob, offset)
        offset += 8
        found: list[Region] = []
        for _ in range(n_layer):
            k_type, k_row = struct.unpack_from("<iQ", blob, offset)
            offset += 12
            if k_type != _GGML_TYPE_F16 or k_row % 2 or k_row == 0:
                return None
            found.append(Region(offset, n_cells, k_row // 2, per_row=False))    # keys: per channel
            offset += n_cells * k_row
        for _ in range(n_layer):
            if v_trans:
                v_type, v_el, n_embd_v = struct.unpack_from("<iII", blob, offset)
                offset += 12
                if v_type != _GGML_TYPE_F16 or v_el != 2 or n_embd_v == 0:
                    return None
                found.append(Region(offset, n_embd_v, n_cells, per_row=False))  # values: per token (column)
                offset += n_embd_v * n_cells * 2
            else:
                v_type, v_row = struct.unpack_from("<iQ", blob, offset)
                offset += 12
                if v_type != _GGML_TYPE_F16 or v_row % 2 or v_row == 0:
                    return None
                found.append(Region(offset, n_cells, v_row // 2, per_row=True))  # values: per token (row)
                offset += n_cells * v_row
        return found if offset == len(blob) and found else None
    except struct.error:
        return None


def _gaps(found: list[Region], length: int) -> list[tuple[int, int]]:
    """The byte ranges of a blob outside its tensors (headers, cells), in order."""
    starts = [0] + [r.offset + r.nbytes for r in found]
    ends = [r.offset for r in found] + [length]
    return list(zip(starts, ends, strict=True))


def _matrix(blob: bytes | bytearray | memoryview, region: Region) -> np.ndarray:
    return np.frombuffer(blob, dtype="<f2", count=region.rows * region.cols,
                         offset=region.offset).reshape(region.rows, region.cols)


def _quantize(values: np.ndarray, per_row: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(minimum f16, step f16, codes uint8) with every value within step/2 of minimum + code * step."""
    axis = 1 if per_row else 0
    wide = values.astype(np.float32)
    low = wide.min(axis=axis, keepdims=True)            # an f16 value: exact in f16
    span = wide.max(axis=axis, keepdims=True) - low
    step = (span / LEVELS).astype(np.float16)
    short = step.astype(np.float32) * LEVELS < span     # f16 rounding went down: one ulp up covers the span
    step = np.where(short, np.nextafter(step, np.float16(np.inf)), step)
    divisor = np.where(step > 0, step.astype(np.float32), np.float32(1.0))
    codes = np.clip(np.rint((wide - low) / divisor), 0, LEVELS).astype(np.uint8)
    return low.astype(np.float16).ravel(), step.ravel(), codes


def pack(blob: bytes | bytearray | memoryview) -> bytes | None:
    """The packed form of a state blob, or None where it is not an f16 one-sequence blob with finite values."""
    found = regions(blob)
    if found is None:
        return None
    payload: list[bytes] = []
    for region in found:
        values = _matrix(blob, region)
        if not np.isfinite(values).all():
            return None
        low, step, codes = _quantize(values, region.per_row)
        payload += [low.tobytes(), step.tobytes(), codes.tobytes()]
    view = memoryview(blob).cast("B")
    skeleton = [bytes(view[start:end]) for start, end in _gaps(found, len(blob))]
    table = b"".join(_REGION.pack(r.offset, r.rows, r.cols, int(r.per_row)) for r in found)
    return b"".join([_HEAD.pack(MAGIC, len(blob), len(found)), table, *skeleton, *payload])


def is_packed(data: bytes | bytearray | memoryview) -> bool:
    return bytes(data[:len(MAGIC)]) == MAGIC


def unpack(packed: bytes | bytearray | memoryview) -> bytearray:
    """The state blob `pack` was given, with K and V dequantized; UnfitPacked for bytes that do not fit."""
    try:
        magic, length, count = _HEAD.unpack_from(packed, 0)
    except struct.error as exc:
        raise UnfitPacked(f"packed K/V too short for its header ({len(packed)} bytes)") from exc
    if magic != MAGIC:
        raise UnfitPacked("not packed K/V of this format")
    table_end = _HEAD.size + count * _REGION.size
    if count == 0 or table_end > len(packed):
        raise UnfitPacked(f"packed K/V names {count} tensors but holds {len(packed)} bytes")
    found = [Region(o, r, c, bool(p)) for o, r, c, p in
             (_REGION.unpack_from(packed, _HEAD.size + i * _REGION.size) for i in range(count))]
    cursor = 0
    for region in found:
        if region.offset < cursor or region.rows == 0 or region.cols == 0:
            raise UnfitPacked("packed K/V tensors overlap or are empty")
        cursor = region.offset + region.nbytes
    if cursor > length:
        raise UnfitPacked("packed K/V tensors run past the blob")
    skeleton_bytes = length - sum(r.nbytes for r in found)
    payload_bytes = sum(r.n_scales * 4 + r.rows * r.cols for r in found)
    if table_end + skeleton_bytes + payload_bytes != len(packed):
        raise UnfitPacked(f"packed K/V holds {len(packed)} bytes, its shapes need "
                          f"{table_end + skeleton_bytes + payload_bytes}")
    blob = bytearray(length)
    source = memoryview(packed).cast("B")
    at = table_end                                 # skeleton: the bytes between tensors, in order
    for start, end in _gaps(found, length):
        blob[start:end] = source[at:at + end - start]
        at += end - start
    for region in found:
        n = region.n_scales
        low = np.frombuffer(packed, dtype="<f2", count=n, offset=at).astype(np.float32)
        step = np.frombuffer(packed, dtype="<f2", count=n, offset=at + 2 * n).astype(np.float32)
        codes = np.frombuffer(packed, dtype=np.uint8, count=region.rows * region.cols, offset=at + 4 * n)
        at += 4 * n + region.rows * region.cols
        if not (np.isfinite(low).all() and np.isfinite(step).all() and (step >= 0).all()):
            raise UnfitPacked("packed K/V scales are not finite and non-negative")
        shape = (region.rows, 1) if region.per_row else (1, region.cols)
        values = (codes.reshape(region.rows, region.cols) * step.reshape(shape) + low.reshape(shape)).astype("<f2")
        if not np.isfinite(values).all():
            raise UnfitPacked("packed K/V values overflow f16")
        blob[region.offset:region.offset + region.nbytes] = values.tobytes()
    if regions(blob) != found:
        raise UnfitPacked("the unpacked blob's layout does not match its packed tensors")
    return blob
