"""The host arena saved K/V is written into (`runtime.host_arena`): page-aligned writable buffers, spans free again
when the last view goes, a cap, and the pageable fallback where pinning is not possible or fails."""

from __future__ import annotations

import gc
import logging

import numpy as np
import pytest

from evoke_engine.runtime import host_arena
from evoke_engine.runtime.host_arena import ALIGN, HostArena

pytestmark = pytest.mark.unit
MB = 1 << 20


def test_buffers_are_page_aligned_writable_and_free_again_when_their_last_view_goes():
    arena = HostArena(64 * MB, chunk_bytes=16 * MB)
    a, b = arena.buffer(3 * MB + 5), arena.buffer(MB)
    assert len(a) == 3 * MB + 5 and not a.readonly
    assert np.frombuffer(a, dtype=np.uint8).ctypes.data % ALIGN == 0
    a[:4] = b"abcd"
    assert bytes(a[:4]) == b"abcd"
    assert arena.used_bytes >= 4 * MB
    view = np.frombuffer(b, dtype=np.uint8)          # a view of b outlives the name b
    del a, b
    gc.collect()
    assert arena.used_bytes == MB                    # b's span is held by the array
    del view
    gc.collect()
    assert arena.used_bytes == 0
    whole = arena.buffer(16 * MB)                    # freed spans coalesce: the whole chunk fits again
    assert whole is not None and arena.reserved_bytes == 16 * MB
    arena.close()


def test_past_the_cap_the_arena_says_no_and_the_caller_allocates():
    arena = HostArena(16 * MB, chunk_bytes=16 * MB)
    first = arena.buffer(12 * MB)
    assert first is not None
    assert arena.buffer(8 * MB) is None
    assert HostArena(0).buffer(MB) is None
    del first


def test_without_a_cuda_runtime_the_arena_is_pageable_and_says_why(monkeypatch):
    monkeypatch.setattr(host_arena, "cuda_runtime", lambda: None)
    arena = HostArena(32 * MB, pin=True, chunk_bytes=16 * MB)
    buffer = arena.buffer(MB)
    assert buffer is not None and arena.pinned_bytes == 0
    assert "no CUDA runtime" in arena.pin_note


class _RefusingRuntime:
    """A CUDA runtime whose cudaHostRegister fails (out of page-locked memory): the arena's fallback path."""

    def __init__(self) -> None:
        self.calls = 0

    def cudaHostRegister(self, address, size, flags):   # noqa: N802 (the CUDA name)
        self.calls += 1
        return 2                                          # cudaErrorMemoryAllocation

    def cudaHostUnregister(self, address):              # noqa: N802
        raise AssertionError("nothing was registered")


def test_where_pinning_fails_the_chunk_stays_pageable_logs_once_and_nothing_more_is_pinned(monkeypatch, caplog):
    refusing = _RefusingRuntime()
    monkeypatch.setattr(host_arena, "cuda_runtime", lambda: refusing)
    arena = HostArena(64 * MB, pin=True, chunk_bytes=16 * MB)
    with caplog.at_level(logging.WARNING, logger=host_arena.__name__):
        kept = [arena.buffer(12 * MB) for _ in range(3)]  # three chunks
    assert all(b is not None for b in kept)
    assert refusing.calls == 1 and arena.pinned_bytes == 0
    assert "returned 2" in arena.pin_note
    assert sum("pinning failed" in r.getMessage() for r in caplog.records) == 1
    kept[0][:] = b"\x01" * len(kept[0])                  # pageable memory all the same
    del kept
    gc.collect()
    assert arena.used_bytes == 0


def test_a_zero_share_makes_no_arena():
    assert host_arena.configure_arena(0.0, pin=False) is None
