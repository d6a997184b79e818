"""The model's own attention per block: the native capture (native/attention_capture.cpp) and its reduction.

Owns the one capture of a Runtime (its `cb_eval` callback, the K store it keeps per sequence, which
`KVCache` keeps in step with every llama.cpp sequence operation through `seq_rm` / `seq_add` /
`seq_cp` / `load_state`); the per-conversation block masses read from it are the memory policy's
(`AttentionSignal`), so nothing here knows blocks. Invariants: without the library, or on a model or cache
it does not cover, `AttentionCapture.create` returns None with the reason logged, and the engine runs as
before; nothing here touches llama.cpp's cells or decodes anything.
"""

from __future__ import annotations

import ctypes
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass

import llama_cpp as ll
import numpy as np

from ..package_files import ATTENTION_LIB, native_library, native_missing_note
from ..settings import ATTENTION_GQA as GQA_REDUCTIONS
from . import reanchor

log = logging.getLogger(__name__)

LIB_NAME = ATTENTION_LIB
DECAY = 0.95                # per scored query step: 0.95 ** 64 = 0.04, so about the last 64 steps count
ADAKV_ALPHA = 0.2           # each head's floor: this share of the uniform per-head budget
KEEP_FRACTION = 0.5         # Ada-KV per-head budget: this share of the sequence's resident tokens
PROMPT_QUERIES = 8          # of a prompt chunk, its last queries are scored (one token per generated step)

_c_int32_p = ctypes.POINTER(ctypes.c_int32)
_c_float_p = ctypes.POINTER(ctypes.c_float)
_lib: ctypes.CDLL | None = None
_lib_note = ""


def load_library() -> ctypes.CDLL | None:
    """The native library (loaded once), or None with the reason in `library_note()`."""
    global _lib, _lib_note
    if _lib is not None or _lib_note:
        return _lib
    path = native_library(LIB_NAME)
    if path is None:
        _lib_note = f"attention capture library missing: {native_missing_note(LIB_NAME)}"
        return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        _lib_note = f"attention capture library unloadable: {exc}"
        return None
    p, i32, i64, f32, u8p, u16p = (ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_float,
                                   ctypes.POINTER(ctypes.c_uint8), ctypes.POINTER(ctypes.c_uint16))
    sigs = {
        "evoke_attn_new": ([], p), "evoke_attn_free": ([p], None),
        "evoke_attn_configure": ([p, _c_int32_p, i32, i32, i32, i32, i32, i32, f32, f32, f32], i32),
        "evoke_attn_set_options": ([p, i32, i32, f32, f32, f32, i32, i32], None),
        "evoke_attn_set_probe": ([p, i32], None), "evoke_attn_set_scored": ([p, i32, i32], None),
        "evoke_attn_set_target": ([p, i32], None),
        "evoke_attn_seq_rm": ([p, i32, i32, i32], None), "evoke_attn_seq_add": ([p, i32, i32, i32, i32], None),
        "evoke_attn_seq_cp": ([p, i32, i32, i32, i32], None),
        "evoke_attn_seq_put_f16": ([p, i32, i32, i64, _c_int32_p, ctypes.c_void_p, i64], None),
        "evoke_attn_seq_n_pos": ([p, i32], i32), "evoke_attn_seq_steps": ([p, i32], i64),
        "evoke_attn_seq_read": ([p, i32, i32, u8p, _c_float_p, _c_float_p, i32, u16p], i32),
        "evoke_attn_queries_scored": ([p], i64),
        "evoke_attn_last": ([p, _c_float_p, _c_int32_p, i32, _c_int32_p], i32),
        "evoke_attn_probe": ([p, _c_float_p, _c_float_p, i32, _c_int32_p], i32),
        "evoke_attn_adakv": ([_c_float_p, i32, i32, i32, f32, _c_int32_p, _c_float_p], i64),
    }
    for name, (argtypes, restype) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
    _lib = lib
    return lib


def library_note() -> str:
    load_library()
    return _lib_note


def adakv(weights: np.ndarray, per_head_budget: int, alpha: float = ADAKV_ALPHA) -> tuple[np.ndarray, np.ndarray]:
    """Ada-KV's allocation on a [heads, positions] weight matrix: (picks per head, picks per position).

    Each head first keeps its top floor(alpha * per_head_budget) positions; the rest of the total
    budget (heads * per_head_budget) goes to the largest remaining weights of all heads at once.
    """
    lib = load_library()
    if lib is None:
        raise RuntimeError(library_note())
    a = np.ascontiguousarray(weights, dtype=np.float32)
    heads, n = a.shape
    picks = np.zeros(heads, dtype=np.int32)
    counts = np.zeros(n, dtype=np.float32)
    lib.evoke_attn_adakv(a.ctypes.data_as(_c_float_p), heads, n, per_head_budget, alpha,
                         picks.ctypes.data_as(_c_int32_p), counts.ctypes.data_as(_c_float_p))
    return picks, counts


def default_layers(n_layer: int) -> list[int]:
    """One layer at about two thirds of the depth."""
    return [min(n_layer - 1, max(0, round(n_layer * 2 / 3) - 1))]


def parse_layers(text: str, n_layer: int) -> list[int]:
    if not text.strip():
        return default_layers(n_layer)
    layers = sorted({int(part) for part in text.replace(" ", "").split(",") if part})
    bad = [layer for layer in layers if not 0 <= layer < n_layer]
    if bad or not layers or len(layers) > 16:
        raise ValueError(f"attention layers {text!r}: give 1 to 16 of 0..{n_layer - 1}")
    return layers


@dataclass(frozen=True)
class StoreView:
    present: np.ndarray     # bool per position
    mass_mean: np.ndarray   # decaying attention mass per position, mean over heads
    mass_adakv: np.ndarray  # decaying share of Ada-KV picks per position
    steps: int


class AttentionCapture:
    """One native capture: hand `cb_eval` / `user_data` to the context, then `attach` the runtime."""

    def __init__(self, lib: ctypes.CDLL, *, gqa: str = "mean") -> None:
        if gqa not in GQA_REDUCTIONS:
            raise ValueError(f"attention GQA reduction {gqa!r}: choose one of {', '.join(GQA_REDUCTIONS)}")
        self.lib = lib
        self.handle = ctypes.c_void_p(lib.evoke_attn_new())
        self.gqa = gqa
        self.cb_eval = ll.ggml_backend_sched_eval_callback(ctypes.cast(lib.evoke_attn_cb_eval, ctypes.c_void_p).value)
        self.user_data = self.handle
        self.layers: list[int] = []
        self.geometry: reanchor.RopeGeometry | None = None
        self.n_head = 0
        self.set_options()

    @classmethod
    def create(cls, *, gqa: str = "mean") -> AttentionCapture | None:
        lib = load_library()
        if lib is None:
            log.warning("attention signal unavailable: %s", library_note())
            return None
        return cls(lib, gqa=gqa)

    def set_options(self, *, enabled: bool = True, decay: float = DECAY, keep_fraction: float = KEEP_FRACTION,
                    alpha: float = ADAKV_ALPHA, prompt_queries: int = PROMPT_QUERIES, round_q: bool = True) -> None:
        self.lib.evoke_attn_set_options(self.handle, int(enabled), int(self.gqa == "max"), decay, keep_fraction,
                                        alpha, prompt_queries, int(round_q))

    def attach(self, rt, *, layers: str = "", scored_seqs: Iterable[int] = ()) -> str:
        """Configure for the loaded model; '' when capturing, else why not (the capture then stays idle)."""
        from .kv import rope_geometry

        if rt.settings.kv_cache_type != "f16":
            return "attention capture needs an f16 K cache"
        geometry = rope_geometry(rt)
        if geometry is None:
            return "attention capture: RoPE type or scaling not covered"
        n_layer = ll.llama_model_n_layer(rt.model)
        self.layers = parse_layers(layers, n_layer)
        self.n_head = ll.llama_model_n_head(rt.model)
        arch = rt.meta("general.architecture") or ""
        scale = float(rt.meta(f"{arch}.attention.scale") or 0.0) or 1.0 / math.sqrt(geometry.head_dim)
        arr = (ctypes.c_int32 * len(self.layers))(*self.layers)
        ok = self.lib.evoke_attn_configure(self.handle, arr, len(self.layers), self.n_head, geometry.n_head_kv,
                                           geometry.head_dim, geometry.n_rot, geometry.mode, geometry.freq_base,
                                           geometry.freq_scale, scale)
        if not ok:
            self.layers = []
            return "attention capture: model geometry not covered"
        self.geometry = geometry
        for seq in scored_seqs:
            self.lib.evoke_attn_set_scored(self.handle, seq, 1)
        rt.before_decode = self.begin_decode
        return ""

    @property
    def active(self) -> bool:
        return self.geometry is not None

    def close(self) -> None:
        """Free the native store; only after the context that calls back into it is freed."""
        if self.handle:
            self.lib.evoke_attn_free(self.handle)
            self.handle = ctypes.c_void_p()

    # -- called around llama.cpp ---------------------------------------------------------------
    def begin_decode(self, seq: int) -> None:
        self.lib.evoke_attn_set_target(self.handle, seq)

    def set_probe(self, on: bool) -> None:
        self.lib.evoke_attn_set_probe(self.handle, int(on))

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        self.lib.evoke_attn_seq_rm(self.handle, seq, p0, p1)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        self.lib.evoke_attn_seq_add(self.handle, seq, p0, p1, delta)

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.lib.evoke_attn_seq_cp(self.handle, src, dst, p0, p1)

    def load_state(self, seq: int, blob: bytes | bytearray | memoryview) -> bool:
        """K rows of the chosen layers from a one-sequence state blob just loaded into `seq`."""
        if self.geometry is None:
            return False
        layout = reanchor.parse(blob, self.geometry)
        if layout is None:
            log.warning("attention capture: state layout not recognised; %s lacks restored rows", seq)
            return False
        buf = np.frombuffer(blob, dtype=np.uint8)
        positions = np.ascontiguousarray(np.ndarray((layout.n_cells,), dtype="<i4", buffer=buf,
                                                    offset=layout.positions_offset, strides=(layout.cell_stride,)))
        row_bytes = self.geometry.n_head_kv * self.geometry.head_dim * 2
        for slot, layer in enumerate(self.layers):
            rows = buf[layout.k_offsets[layer]:layout.k_offsets[layer] + layout.n_cells * row_bytes]
            self.lib.evoke_attn_seq_put_f16(self.handle, seq, slot, layout.n_cells,
                                            positions.ctypes.data_as(_c_int32_p), rows.ctypes.data, row_bytes)
        return True

    # -- reads --------------------------------------------------------------------------------
    def view(self, seq: int) -> StoreView:
        n = self.lib.evoke_attn_seq_n_pos(self.handle, seq)
        present = np.zeros(n, dtype=np.uint8)
        mean = np.zeros(n, dtype=np.float32)
        ada = np.zeros(n, dtype=np.float32)
        self.lib.evoke_attn_seq_read(self.handle, seq, n, present.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)),
                                     mean.ctypes.data_as(_c_float_p), ada.ctypes.data_as(_c_float_p), -1, None)
        return StoreView(present.astype(bool), mean, ada, self.lib.evoke_attn_seq_steps(self.handle, seq))

    def k_rows(self, seq: int, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """(present per position, f16 K rows [positions, n_head_kv * head_dim]) of a chosen layer."""
        slot = self.layers.index(layer)
        n = self.lib.evoke_attn_seq_n_pos(self.handle, seq)
        width = self.geometry.n_head_kv * self.geometry.head_dim
        present = np.zeros(n, dtype=np.uint8)
        rows = np.zeros((n, width), dtype=np.float16)
        self.lib.evoke_attn_seq_read(self.handle, seq, n, present.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)),
                                     None, None, slot, rows.ctypes.data_as(ctypes.POINTER(ctypes.c_uint16)))
        return present.astype(bool), rows

    def last_query(self) -> tuple[int, np.ndarray, np.ndarray]:
        """(query position, candidate positions, weights [n_head, candidates]) of the last scored query."""
        cap = 4096
        for _ in range(2):
            positions = np.zeros(cap, dtype=np.int32)
            weights = np.zeros(cap * self.n_head, dtype=np.float32)
            qpos = ctypes.c_int32()
            n = self.lib.evoke_attn_last(self.handle, weights.ctypes.data_as(_c_float_p),
                                         positions.ctypes.data_as(_c_int32_p), cap, ctypes.byref(qpos))
            if n >= 0:
                return qpos.value, positions[:n], weights[:n * self.n_head].reshape(self.n_head, n)
            cap = -n
        raise RuntimeError("last query changed while read")

    def probe(self, n_kv_cap: int) -> tuple[np.ndarray, np.ndarray]:
        """llama.cpp's own kq_soft_max row of the last token (first chosen layer) and its mask row."""
        weights = np.zeros(n_kv_cap * self.n_head, dtype=np.float32)
        mask = np.zeros(n_kv_cap, dtype=np.float32)
        n_head = ctypes.c_int32()
        n = self.lib.evoke_attn_probe(self.handle, weights.ctypes.data_as(_c_float_p), mask.ctypes.data_as(_c_float_p),
                                      n_kv_cap, ctypes.byref(n_head))
        if n < 0:
            raise ValueError(f"probe row holds {-n} cells, more than {n_kv_cap}")
        return weights[:n * n_head.value].reshape(n_head.value, n), mask[:n]


def attach_capture(capture: AttentionCapture | None, rt, settings, emit) -> AttentionCapture | None:
    """The capture ready for `rt`'s slots, or None (with an error event saying why) when it cannot run."""
    from ..events import EngineEvent, EventKind

    if capture is None:
        if settings.attention_capture:
            emit(EngineEvent(EventKind.ERROR, f"attention signal off: {library_note()}"))
        return None
    try:
        note = capture.attach(rt, layers=settings.attention_layers, scored_seqs=range(settings.slots))
    except ValueError as exc:
        note = str(exc)
    if note:
        capture.set_options(enabled=False)
        emit(EngineEvent(EventKind.ERROR, f"attention signal off: {note}"))
        return None
    return capture
