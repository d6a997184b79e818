"""Re-anchoring saved K/V bytes to new positions without llama.cpp's whole-cache K-shift.

Owns the parse of llama.cpp's sequence-state layout (as written by `llama_state_seq_get_data`
for one sequence, f16 K) and the call into native/rope_reanchor.c. Invariant: a blob is only
rewritten when every field matches what this model should write; otherwise `None` is returned
and the caller uses llama.cpp's own shift, which is always correct.
"""

from __future__ import annotations

import ctypes
import logging
import struct
from dataclasses import dataclass

import numpy as np

from ..package_files import ROPE_LIB, native_library, native_missing_note

log = logging.getLogger(__name__)

_LIB_NAME = ROPE_LIB
_GGML_TYPE_F16 = 1
_ROPE_NORM, _ROPE_NEOX = 0, 2


def _load_native() -> ctypes.CDLL | None:
    path = native_library(_LIB_NAME)
    if path is None:
        log.info("native re-anchor library missing (%s): using llama.cpp's K-shift", native_missing_note(_LIB_NAME))
        return None
    lib = ctypes.CDLL(str(path))
    fn = lib.evoke_rope_shift_f16
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                   ctypes.c_int32, ctypes.c_float, ctypes.c_float, ctypes.c_float]
    fn.restype = None
    return lib


_native = _load_native()


@dataclass(frozen=True)
class RopeGeometry:
    n_layer: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    mode: int            # 0 NORM, 2 NEOX
    freq_base: float
    freq_scale: float


@dataclass(frozen=True)
class BlobLayout:
    positions_offset: int       # first cell's pos field
    cell_stride: int            # bytes per cell record
    n_cells: int
    k_offsets: tuple[int, ...]  # per layer, first K row


def available() -> bool:
    return _native is not None


def parse(blob: bytes | bytearray, geometry: RopeGeometry) -> BlobLayout | None:
    """Locate cell positions and per-layer K rows in a one-sequence state blob, or None."""
    try:
        _magic, _version, n_stream, n_cells = struct.unpack_from("<IIII", blob, 0)
        if n_stream != 1 or n_cells == 0:
            return None
        offset = 16
        positions_offset = offset
        for _ in range(n_cells):
            _pos, n_seq = struct.unpack_from("<iI", blob, offset)
            if n_seq != 1:
                return None
            offset += 8 + 4 * n_seq
        cell_stride = (offset - positions_offset) // n_cells
        _v_trans, n_layer = struct.unpack_from("<II", blob, offset)
        offset += 8
        if n_layer != geometry.n_layer:
            return None
        row_bytes = geometry.n_head_kv * geometry.head_dim * 2
        k_offsets = []
        for _ in range(n_layer):
            k_type, k_row = struct.unpack_from("<iQ", blob, offset)
            offset += 12
            if k_type != _GGML_TYPE_F16 or k_row != row_bytes:
                return None
            k_offsets.append(offset)
            offset += n_cells * k_row
        return BlobLayout(positions_offset, cell_stride, n_cells, tuple(k_offsets))
    except struct.error:
        return None


def shift(blob: bytearray, layout: BlobLayout, geometry: RopeGeometry, delta: int) -> None:
    """In place: every cell's position += delta and every K row rotated by delta."""
    if _native is None:
        raise RuntimeError("the native RoPE re-anchor library is not loaded (run native/build.sh)")
    cells = np.ndarray((layout.n_cells,), dtype="<i4", buffer=blob, offset=layout.positions_offset,
                       strides=(layout.cell_stride,))
    cells += delta
    base = ctypes.addressof((ctypes.c_char * len(blob)).from_buffer(blob))
    for k_offset in layout.k_offsets:
        _native.evoke_rope_shift_f16(base + k_offset, layout.n_cells, geometry.n_head_kv,
                                     geometry.head_dim, geometry.n_rot, geometry.mode, float(delta),
                                     geometry.freq_base, geometry.freq_scale)
