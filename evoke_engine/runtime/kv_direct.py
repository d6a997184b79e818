"""The direct KV data path: a block's cells copied between the KV cache's layer tensors and host bytes in one pass.

Owns the calls into native/kv_direct.cpp (libevoke_kvdirect.so). The bytes are llama.cpp's one-sequence state
format, byte for byte what `llama_state_seq_get_data` writes for a sequence holding exactly those cells, so KV
files, the packed host tier, `state_cells.cut` and the serialised path read them unchanged. A save is one copy per
layer for K and for V where the cells are contiguous (else one per run of cells); a restore is the same copy the
other way, with the RoPE re-anchor fused into it on a host buffer (the CPU backend) or left to llama.cpp's K-shift
on the device (the cells carry the shift, applied by the next decode).

Invariants: a `DirectKV` exists only for a context whose cache the native helper recognises (a plain KV cache:
no sliding window, no recurrent or hybrid memory); `open` returns None with the reason otherwise and the caller
keeps the serialised path. Nothing is changed by a call that fails (`DirectError` carries why). Only the engine
thread calls in.
"""

from __future__ import annotations

import ctypes
import logging

import numpy as np

from ..package_files import KV_DIRECT_LIB, native_library, native_missing_note
from .reanchor import RopeGeometry

log = logging.getLogger(__name__)

_LIB_NAME = KV_DIRECT_LIB
_u8p = ctypes.POINTER(ctypes.c_uint8)

BAD_RANGE, UNFIT, NO_ROOM, TAKEN, SMALL_BUFFER, BAD_SEQ = -1, -2, -3, -4, -5, -6
_REASONS = {BAD_RANGE: "the sequence does not hold each position of the range once",
            UNFIT: "the bytes are not a one-sequence state of this cache's shape",
            NO_ROOM: "not enough free cells in the context",
            TAKEN: "the sequence already holds positions the block would take",
            SMALL_BUFFER: "the output buffer is too small",
            BAD_SEQ: "no such sequence"}


class DirectError(RuntimeError):
    def __init__(self, status: int, what: str) -> None:
        super().__init__(f"{what}: {_REASONS.get(status, f'status {status}')}")
        self.status = status


def _load() -> ctypes.CDLL | None:
    path = native_library(_LIB_NAME)
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:                 # built against another llama-cpp-python than the one installed
        log.warning("the direct KV library did not load (%s): KV blocks move through llama.cpp's serialised state",
                    exc)
        return None
    vp, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
    signatures = {
        "evoke_kvd_open": ([vp, ctypes.c_char_p, ctypes.c_size_t], vp),
        "evoke_kvd_close": ([vp], None),
        "evoke_kvd_on_host": ([vp], ctypes.c_int),
        "evoke_kvd_has_shift": ([vp], ctypes.c_int),
        "evoke_kvd_save_size": ([vp, i32, i32, i32], i64),
        "evoke_kvd_apply_shift": ([vp, i32, i32, i32, i32, ctypes.c_float, ctypes.c_float], i64),
        "evoke_kvd_save": ([vp, i32, i32, i32, i32, vp, i64], i64),
        "evoke_kvd_save_plan": ([vp, i32, i32, i32, i32, vp, i64, ctypes.POINTER(i64)], vp),
        "evoke_kvd_save_rows": ([vp], i64),
        "evoke_kvd_save_cancel": ([vp], None),
        "evoke_kvd_restore": ([vp, vp, i64, i32, i32, i32, i32, i32, i32, i32, ctypes.c_float, ctypes.c_float,
                               ctypes.POINTER(ctypes.c_uint32)], i64),
        "evoke_kvd_cell_of": ([vp, i32, i32], i64),
        "evoke_kvd_set_test_row_offset": ([i32], None),
    }
    for name, (args, result) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    return lib


_native = _load()


def available() -> bool:
    return _native is not None


def missing_note() -> str:
    return native_missing_note(_LIB_NAME) if native_library(_LIB_NAME) is None else "did not load"


def _address(data: bytes | bytearray | memoryview) -> tuple[int, np.ndarray]:
    """The address of a buffer's first byte (no copy) and the array that keeps the buffer exported meanwhile."""
    array = np.frombuffer(data, dtype=np.uint8)
    return array.ctypes.data, array


class DirectKV:
    """The direct path over one context's KV cache (`open` it; None where the cache is not covered)."""

    def __init__(self, handle: int, ctx) -> None:
        self._handle = handle
        self._ctx = ctx                          # held: the handle points into this context
        self.on_host = bool(_native.evoke_kvd_on_host(handle))

    @classmethod
    def open(cls, ctx) -> tuple[DirectKV | None, str]:
        """(the direct path over `ctx`'s cache, "") or (None, why not)."""
        if _native is None:
            return None, f"native library {missing_note()}"
        why = ctypes.create_string_buffer(256)
        handle = _native.evoke_kvd_open(ctx, why, len(why))
        if not handle:
            return None, why.value.decode(errors="replace")
        return cls(handle, ctx), ""

    def close(self) -> None:
        if self._handle:
            _native.evoke_kvd_close(self._handle)
            self._handle = 0

    @property
    def shift_pending(self) -> bool:
        """Cells moved since the last decode: their K rows are not yet rotated for their positions."""
        return bool(_native.evoke_kvd_has_shift(self._handle))

    def apply_shift(self, g: RopeGeometry) -> int:
        """Every pending K-shift applied here (host buffers, f16 K): only the cells that owe one are rotated, as
        llama.cpp's K-shift graph would rotate them at the next decode over the whole cache. Returns the cells
        rotated; DirectError (nothing changed) where the cache's K is not f16 on the host."""
        rotated = _native.evoke_kvd_apply_shift(self._handle, g.n_head_kv, g.head_dim, g.n_rot, g.mode,
                                                g.freq_base, g.freq_scale)
        if rotated < 0:
            raise DirectError(rotated, "pending K-shift")
        return rotated

    def save_size(self, seq: int, p0: int, p1: int) -> int:
        size = _native.evoke_kvd_save_size(self._handle, seq, p0, p1)
        if size < 0:
            raise DirectError(size, f"save of [{p0}, {p1}) of seq {seq}")
        return size

    def save_into(self, out: bytearray | memoryview, seq: int, p0: int, p1: int, as_seq: int) -> int:
        """The state of [p0, p1) of `seq` written into `out` (at least `save_size` bytes, writable), labelled
        as sequence `as_seq`'s (what the serialised path's scratch copy writes). Returns the bytes written."""
        address, _array = _address(out)
        if _array.flags.writeable is False:
            raise ValueError("save_into needs a writable buffer")
        written = _native.evoke_kvd_save(self._handle, seq, p0, p1, as_seq, address, len(out))
        if written < 0:
            raise DirectError(written, f"save of [{p0}, {p1}) of seq {seq}")
        return written

    def plan_save(self, out: bytearray | memoryview, seq: int, p0: int, p1: int, as_seq: int) -> int:
        """The first half of `save_into` (engine thread): the cells found, the header and cell records written into
        `out`. Returns a plan for `copy_rows`, which any thread may run while the cells are not written."""
        address, _array = _address(out)
        status = ctypes.c_int64(0)
        plan = _native.evoke_kvd_save_plan(self._handle, seq, p0, p1, as_seq, address, len(out),
                                           ctypes.byref(status))
        if not plan:
            raise DirectError(status.value, f"save of [{p0}, {p1}) of seq {seq}")
        return plan

    @staticmethod
    def copy_rows(plan: int) -> int:
        """The second half: the planned cells' K and V rows copied into the plan's buffer (the GIL is released
        meanwhile); the plan is freed. Returns the bytes of the whole state."""
        written = _native.evoke_kvd_save_rows(plan)
        if written < 0:
            raise DirectError(written, "copy of planned rows")
        return written

    def save(self, seq: int, p0: int, p1: int, as_seq: int) -> bytearray:
        out = bytearray(self.save_size(seq, p0, p1))
        self.save_into(out, seq, p0, p1, as_seq)
        return out

    def restore(self, data: bytes | bytearray | memoryview, seq: int, delta: int,
                rotate: RopeGeometry | None = None, cells_out: list[int] | None = None) -> int:
        """Place the cells of `data` into `seq` at their positions + `delta`; `rotate`: re-anchor K by `delta` as it
        lands (host buffers, f16 K), else a non-zero delta stays a pending K-shift for llama.cpp to apply.
        Returns the cells placed; DirectError (nothing changed) when they cannot be."""
        address, keep = _address(data)
        n_cells = int.from_bytes(bytes(memoryview(data)[12:16]), "little") if len(data) >= 16 else 0
        cells = (ctypes.c_uint32 * max(n_cells, 1))() if cells_out is not None else None
        g = rotate
        placed = _native.evoke_kvd_restore(
            self._handle, address, len(data), seq, delta, int(g is not None),
            g.n_head_kv if g else 0, g.head_dim if g else 0, g.n_rot if g else 0, g.mode if g else 0,
            g.freq_base if g else 0.0, g.freq_scale if g else 0.0, cells)
        del keep
        if placed < 0:
            raise DirectError(placed, f"restore of {n_cells} cells into seq {seq}")
        if cells_out is not None:
            cells_out[:] = list(cells[:placed])
        return placed

    def cell_of(self, seq: int, pos: int) -> int:
        """The cell holding position `pos` of `seq`, -1 when none."""
        return int(_native.evoke_kvd_cell_of(self._handle, seq, pos))


def set_test_row_offset(offset: int) -> None:
    """Tests only: restores copy rows `offset` cells away from the cells they mark (0 turns it off)."""
    if _native is not None:
        _native.evoke_kvd_set_test_row_offset(offset)
