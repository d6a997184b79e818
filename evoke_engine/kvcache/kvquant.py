"""8- and 4-bit host storage of saved K/V bytes: pack a sequence-state blob's f16 K and V to codes, unpack to the blob.

Owns the packed format and the walk of every K and V tensor of a one-sequence state blob (reanchor.parse
finds the K rows only). KIVI-style: keys per channel (min and step over the block's tokens), values per
token, per layer, with f16 minimum and step; at 4 bits, per group of 32 along that axis where it divides.
Every layer's K (or V) is packed and unpacked in one pass: by native/kvquant.c (libevoke_kvquant.so) where it is
built and agrees bit for bit with the numpy path on a probe when this module loads, else by numpy over the stacked
layers; the bytes are the same either way.
Invariants: `unpack(pack(blob))` has the exact length and every byte outside the K/V data of `blob` (headers,
positions, sequence ids); each value is within half a step (plus the f16 rounding of the result) of the
original; `pack` returns None for anything it does not cover (a q8_0 cache, non-finite values, an unknown
layout) and the caller keeps those bytes as they are; `unpack` raises UnfitPacked for packed bytes whose
header, shapes or scales do not fit, writing nothing.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import struct
from dataclasses import dataclass

import numpy as np

from ..package_files import KV_QUANT_LIB, native_library

log = logging.getLogger(__name__)

MAGIC_PREFIX = b"EVKVQ"                 # then format 2, bits (8 or 4), 0
_HEAD = struct.Struct("<8sQI")          # magic, unpacked length, region count
_REGION = struct.Struct("<QIIII")       # offset, rows, cols, per_row, group
_GGML_TYPE_F16 = 1
BITS = (8, 4)
GROUP_4BIT = 32                         # at 4 bits, one (minimum, step) per 32 values along the scaled axis


def magic(bits: int) -> bytes:
    return MAGIC_PREFIX + bytes([2, bits, 0])


class UnfitPacked(ValueError):
    """Packed K/V bytes that do not describe a blob this module wrote (corrupt, truncated, other format)."""


@dataclass(frozen=True)
class Region:
    """An f16 matrix of `rows` x `cols` at `offset`, scaled along each row (`per_row`: values per token) or each
    column (keys per channel); `group` values along that axis share one (minimum, step) (0: the whole axis)."""

    offset: int
    rows: int
    cols: int
    per_row: bool
    group: int = 0

    @property
    def nbytes(self) -> int:
        return self.rows * self.cols * 2

    @property
    def lines(self) -> int:
        """Rows or columns: the lines along which values are scaled."""
        return self.rows if self.per_row else self.cols

    @property
    def length(self) -> int:
        return self.cols if self.per_row else self.rows

    @property
    def n_scales(self) -> int:
        return self.lines * (self.length // (self.group or self.length))

    def code_bytes(self, bits: int) -> int:
        return (self.rows * self.cols * bits + 7) // 8

    def grouped(self, bits: int) -> Region:
        """This region with the group `bits` use: the whole axis at 8 bits, GROUP_4BIT where it divides at 4."""
        group = GROUP_4BIT if bits == 4 and self.length % GROUP_4BIT == 0 else 0
        return dataclasses.replace(self, group=group)


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


def _lines(values: np.ndarray, region: Region) -> np.ndarray:
    """The matrix as [line, group, value]: the axis scaled along is last, cut into the region's groups."""
    lined = values if region.per_row else values.T
    group = region.group or region.length
    return lined.reshape(region.lines, region.length // group, group)


def _unlined(grouped: np.ndarray, region: Region) -> np.ndarray:
    lined = grouped.reshape(region.lines, region.length)
    return lined if region.per_row else lined.T


def _quantize(grouped: np.ndarray, bits: int, axis: int = 2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(minimum f16, step f16, codes) per group (the values along `axis`), every value within step/2 of
    minimum + code * step; minimum and step keep the other axes, codes the input's shape."""
    levels = (1 << bits) - 1
    wide = grouped.astype(np.float32)
    low = wide.min(axis=axis, keepdims=True)            # an f16 value: exact in f16
    span = wide.max(axis=axis, keepdims=True) - low
    step = (span / levels).astype(np.float16)
    short = step.astype(np.float32) * levels < span     # f16 rounding went down: one ulp up covers the span
    step = np.where(short, np.nextafter(step, np.float16(np.inf)), step)
    divisor = np.where(step > 0, step.astype(np.float32), np.float32(1.0))
    wide -= low
    wide /= divisor
    np.rint(wide, out=wide)
    np.clip(wide, 0, levels, out=wide)
    return low.astype(np.float16), step, wide.astype(np.uint8)


def _batches(found: list[Region]) -> list[list[Region]]:
    """Consecutive regions of one shape at one spacing (every layer's K, every layer's V): one numpy pass each."""
    batches: list[list[Region]] = []
    for region in found:
        last = batches[-1] if batches else None
        if (last and dataclasses.replace(last[0], offset=0) == dataclasses.replace(region, offset=0)
                and (len(last) == 1 or region.offset - last[-1].offset == last[1].offset - last[0].offset)
                and region.offset - last[-1].offset >= region.nbytes):
            last.append(region)
        else:
            batches.append([region])
    return batches


def _stacked(blob: bytes | bytearray | memoryview, batch: list[Region], writable: bool = False) -> np.ndarray:
    """The batch's f16 matrices as one (layers, rows, cols) view of `blob` (no copy)."""
    first = batch[0]
    spacing = batch[1].offset - first.offset if len(batch) > 1 else first.nbytes
    array = np.ndarray((len(batch), first.rows, first.cols), dtype="<f2", buffer=blob, offset=first.offset,
                       strides=(spacing, first.cols * 2, 2))
    return array


def _quantize_batch(values: np.ndarray, region: Region, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`_quantize` over every layer of a batch at once: per layer, (minimum, step) in the order of
    `_lines(values, region)`'s groups and the codes in its value order, as flat rows."""
    n, rows, cols = values.shape
    if region.per_row:                               # values per token: groups along each row
        group = region.group or cols
        low, step, codes = _quantize(values.reshape(n, rows, cols // group, group), bits, axis=3)
        return low.reshape(n, -1), step.reshape(n, -1), codes.reshape(n, -1)
    group = region.group or rows                     # keys per channel: groups down each column
    low, step, codes = _quantize(values.reshape(n, rows // group, group, cols), bits, axis=2)
    order = (0, 3, 1, 2)                             # [layer, column, group, value]: `_lines`'s order
    return (low.transpose(order).reshape(n, -1), step.transpose(order).reshape(n, -1),
            codes.reshape(n, rows, cols).transpose(0, 2, 1).reshape(n, -1))


def _dequantize_batch(codes: np.ndarray, low: np.ndarray, step: np.ndarray, region: Region) -> np.ndarray:
    """The inverse of `_quantize_batch`: (layers, rows, cols) f16 values from flat per-layer codes and scales."""
    n, rows, cols = codes.shape[0], region.rows, region.cols
    if region.per_row:
        group = region.group or cols
        shape = (n, rows, cols // group, 1)
        values = codes.reshape(n, rows, cols // group, group) * step.reshape(shape) + low.reshape(shape)
        return values.astype("<f2").reshape(n, rows, cols)
    group = region.group or rows
    shape = (n, cols, rows // group, 1)
    values = codes.reshape(n, cols, rows // group, group) * step.reshape(shape) + low.reshape(shape)
    return values.astype("<f2").reshape(n, cols, rows).transpose(0, 2, 1)


def _code_bytes(codes: np.ndarray, bits: int) -> bytes:
    if bits == 8:
        return codes.tobytes()
    padded = np.append(codes, np.uint8(0)) if codes.size % 2 else codes
    return (padded[0::2] | (padded[1::2] << 4)).astype(np.uint8).tobytes()


def _nibbles(codes: np.ndarray) -> np.ndarray:
    """4-bit codes (one per byte, per layer rows) two to a byte, low nibble first, each row padded to a byte."""
    if codes.shape[1] % 2:
        codes = np.concatenate([codes, np.zeros((codes.shape[0], 1), dtype=np.uint8)], axis=1)
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def _codes_of(packed: bytes | bytearray | memoryview, offset: int, count: int, bits: int) -> np.ndarray:
    raw = np.frombuffer(packed, dtype=np.uint8, count=(count * bits + 7) // 8, offset=offset)
    if bits == 8:
        return raw
    return np.stack([raw & 0x0F, raw >> 4], axis=1).ravel()[:count]


def _load_native() -> ctypes.CDLL | None:
    path = native_library(KV_QUANT_LIB)
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError:
        return None
    i32, i64, vp = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p
    lib.evoke_kvq_pack.argtypes = [vp, i64, i32, i32, i32, i32, i32, i32, vp]
    lib.evoke_kvq_pack.restype = ctypes.c_int
    lib.evoke_kvq_unpack.argtypes = [vp, i32, i32, i32, i32, i32, i32, vp, i64]
    lib.evoke_kvq_unpack.restype = None
    lib.evoke_kvq_layer_bytes.argtypes = [i32, i32, i32, i32, i32]
    lib.evoke_kvq_layer_bytes.restype = i64
    return lib


def _spacing(batch: list[Region]) -> int:
    return batch[1].offset - batch[0].offset if len(batch) > 1 else batch[0].nbytes


def _pack_batch_native(blob, batch: list[Region], bits: int) -> bytes | None:
    region = batch[0]
    per_layer = _native.evoke_kvq_layer_bytes(region.rows, region.cols, int(region.per_row), region.group, bits)
    out = np.empty(len(batch) * per_layer, dtype=np.uint8)
    source = np.frombuffer(blob, dtype=np.uint8)
    bad = _native.evoke_kvq_pack(source.ctypes.data + region.offset, _spacing(batch), len(batch), region.rows,
                                 region.cols, int(region.per_row), region.group, bits, out.ctypes.data)
    return None if bad else out.tobytes()


def _pack_batch_numpy(blob, batch: list[Region], bits: int) -> bytes | None:
    values = _stacked(blob, batch)
    if not np.isfinite(values).all():
        return None
    low, step, codes = _quantize_batch(values, batch[0], bits)
    packed_codes = _nibbles(codes) if bits == 4 else codes
    return np.concatenate([low.view(np.uint8), step.view(np.uint8), packed_codes], axis=1).tobytes()


def _native_agrees(lib: ctypes.CDLL) -> bool:
    """The native kernels give numpy's bytes on a probe of every shape kind (per row, per column, 4-bit groups)."""
    global _native
    rng = np.random.default_rng(7)
    probe = bytearray(rng.normal(0, 2, size=3 * 70 * 64).astype("<f2").tobytes())
    kept, _native = _native, lib
    try:
        for per_row in (True, False):
            for bits in BITS:
                batch = [Region(i * 70 * 64 * 2, 70 if per_row else 64, 64 if per_row else 70, per_row)
                         .grouped(bits) for i in range(3)]
                if per_row is False and bits == 4:
                    batch = [dataclasses.replace(r, rows=64, cols=70, group=32) for r in batch]
                packed = _pack_batch_numpy(probe, batch, bits)
                if _pack_batch_native(probe, batch, bits) != packed:
                    return False
                ours, theirs = bytearray(len(probe)), bytearray(len(probe))
                _unpack_batch_native(packed, batch, bits, ours)
                _unpack_batch_numpy(packed, batch, bits, theirs)
                if ours != theirs:
                    return False
        return True
    finally:
        _native = kept


def _unpack_batch_native(rows: bytes | np.ndarray, batch: list[Region], bits: int, blob: bytearray) -> None:
    region = batch[0]
    source = np.frombuffer(rows, dtype=np.uint8) if not isinstance(rows, np.ndarray) else np.ascontiguousarray(rows)
    target = np.frombuffer(blob, dtype=np.uint8)
    _native.evoke_kvq_unpack(source.ctypes.data, len(batch), region.rows, region.cols, int(region.per_row),
                             region.group, bits, target.ctypes.data + region.offset, _spacing(batch))


def _unpack_batch_numpy(rows: bytes | np.ndarray, batch: list[Region], bits: int, blob: bytearray) -> None:
    region, layers = batch[0], len(batch)
    n = region.n_scales
    rows = np.frombuffer(rows, dtype=np.uint8).reshape(layers, -1) if not isinstance(rows, np.ndarray) else rows
    low = rows[:, :2 * n].copy().view("<f2").astype(np.float32)
    step = rows[:, 2 * n:4 * n].copy().view("<f2").astype(np.float32)
    raw = rows[:, 4 * n:]
    codes = raw if bits == 8 else np.stack([raw & 0x0F, raw >> 4], axis=2).reshape(layers, -1)
    codes = codes[:, :region.rows * region.cols]
    _stacked(blob, batch)[...] = _dequantize_batch(codes, low, step, region)


_native: ctypes.CDLL | None = None
_candidate = _load_native()
if _candidate is not None:
    if _native_agrees(_candidate):
        _native = _candidate
    else:
        log.warning("the native 8/4-bit kernels differ from the numpy path on this machine: numpy is used")


def native_kernels() -> bool:
    """Whether packing runs in the native kernels (found, loaded and giving numpy's bytes here), not numpy."""
    return _native is not None


def pack(blob: bytes | bytearray | memoryview, bits: int = 8) -> bytes | None:
    """The packed form of a state blob at `bits` (8 or 4), or None where it is not an f16 one-sequence blob with
    finite values."""
    if bits not in BITS:
        raise ValueError(f"kvquant packs at {BITS} bits, not {bits}")
    found = regions(blob)
    if found is None:
        return None
    found = [region.grouped(bits) for region in found]
    payload: list[bytes] = []
    pack_batch = _pack_batch_numpy if _native is None else _pack_batch_native
    for batch in _batches(found):                    # every layer's K (or V) in one pass
        rows = pack_batch(blob, batch, bits)
        if rows is None:                             # a value that is not finite
            return None
        payload.append(rows)
    view = memoryview(blob).cast("B")
    skeleton = [bytes(view[start:end]) for start, end in _gaps(found, len(blob))]
    table = b"".join(_REGION.pack(r.offset, r.rows, r.cols, int(r.per_row), r.group) for r in found)
    return b"".join([_HEAD.pack(magic(bits), len(blob), len(found)), table, *skeleton, *payload])


def bits_of(data: bytes | bytearray | memoryview) -> int | None:
    """8 or 4 for bytes `pack` wrote (by their magic; `unpack` checks the rest), None for anything else."""
    head = bytes(data[:len(magic(8))])
    return next((bits for bits in BITS if head == magic(bits)), None)


def is_packed(data: bytes | bytearray | memoryview) -> bool:
    return bits_of(data) is not None


def unpack(packed: bytes | bytearray | memoryview) -> bytearray:
    """The state blob `pack` was given, with K and V dequantized; UnfitPacked for bytes that do not fit."""
    return _read(packed, values=True)


def skeleton(packed: bytes | bytearray | memoryview) -> bytearray:
    """The blob `unpack` would return with its K and V left zero: every check of `unpack` (shapes, scales, every
    value finite) without the dequantizing, for checking a file before any of it is used."""
    return _read(packed, values=False)


def _read(packed: bytes | bytearray | memoryview, *, values: bool) -> bytearray:
    try:
        head, length, count = _HEAD.unpack_from(packed, 0)
    except struct.error as exc:
        raise UnfitPacked(f"packed K/V too short for its header ({len(packed)} bytes)") from exc
    bits = bits_of(head)
    if bits is None:
        raise UnfitPacked("not packed K/V of this format")
    table_end = _HEAD.size + count * _REGION.size
    if count == 0 or table_end > len(packed):
        raise UnfitPacked(f"packed K/V names {count} tensors but holds {len(packed)} bytes")
    found = [Region(o, r, c, bool(p), g) for o, r, c, p, g in
             (_REGION.unpack_from(packed, _HEAD.size + i * _REGION.size) for i in range(count))]
    cursor = 0
    for region in found:
        if region.offset < cursor or region.rows == 0 or region.cols == 0:
            raise UnfitPacked("packed K/V tensors overlap or are empty")
        if region != region.grouped(bits):
            raise UnfitPacked(f"packed K/V groups of {region.group} do not fit {bits}-bit packing")
        cursor = region.offset + region.nbytes
    if cursor > length:
        raise UnfitPacked("packed K/V tensors run past the blob")
    skeleton_bytes = length - sum(r.nbytes for r in found)
    payload_bytes = sum(r.n_scales * 4 + r.code_bytes(bits) for r in found)
    if table_end + skeleton_bytes + payload_bytes != len(packed):
        raise UnfitPacked(f"packed K/V holds {len(packed)} bytes, its shapes need "
                          f"{table_end + skeleton_bytes + payload_bytes}")
    blob = bytearray(length)
    source = memoryview(packed).cast("B")
    at = table_end                                 # skeleton: the bytes between tensors, in order
    for start, end in _gaps(found, length):
        blob[start:end] = source[at:at + end - start]
        at += end - start
    levels = (1 << bits) - 1
    for batch in _batches(found):                    # every layer's K (or V) in one pass
        region, layers = batch[0], len(batch)
        n, code_bytes = region.n_scales, region.code_bytes(bits)
        per_layer = 4 * n + code_bytes
        rows = np.frombuffer(packed, dtype=np.uint8, count=layers * per_layer, offset=at).reshape(layers, per_layer)
        at += layers * per_layer
        low = rows[:, :2 * n].copy().view("<f2").astype(np.float32)
        step = rows[:, 2 * n:4 * n].copy().view("<f2").astype(np.float32)
        if not (np.isfinite(low).all() and np.isfinite(step).all() and (step >= 0).all()):
            raise UnfitPacked("packed K/V scales are not finite and non-negative")
        if not np.isfinite((low + levels * step).astype(np.float16)).all():
            raise UnfitPacked("packed K/V values overflow f16")
        if not values:
            continue
        (_unpack_batch_numpy if _native is None else _unpack_batch_native)(rows, batch, bits, blob)
    if [dataclasses.replace(r, group=0) for r in found] != regions(blob):
        raise UnfitPacked("the unpacked blob's layout does not match its packed tensors")
    return blob
