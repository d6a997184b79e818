"""Host memory that saved K/V blocks are written into: page-locked on a CUDA build, pre-faulted pageable elsewhere.

Owns `HostArena` (chunks of mapped memory, handed out as writable memoryviews) and the process's one arena
(`configure_arena`, `host_arena`). Why: a save that writes into fresh pages pays a page fault per 4 KB (about as
much as the copy itself on the CPU), and a GPU copies at the link's speed only from page-locked memory.
Invariants: `used_bytes` is the bytes of live buffers; a buffer's span is free again when the last view of it is
gone (garbage collection: no caller frees by hand); a chunk is unmapped only when no buffer is in it; the arena
never grows past its cap (`buffer` returns None and the caller allocates); pinning that fails leaves the chunk
pageable, logs once and pins nothing more. Thread-safe (a save may fill a buffer on a worker thread).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 << 20           # the arena grows (and gives back) memory in chunks of this size
KEEP_IDLE_BYTES = 256 << 20      # empty chunks kept mapped (and pinned) for the next saves, up to this much
ALIGN = 4096                     # every buffer starts on a page: DMA from pinned pages, whole-page copies
_CUDA_HOST_REGISTER_PORTABLE = 1


def cuda_runtime() -> ctypes.CDLL | None:
    """The CUDA runtime library (the one a CUDA build of llama.cpp loads; pip's nvidia packages first), or None."""
    candidates = ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    try:
        import nvidia
        for root in nvidia.__path__:
            candidates = [str(p) for p in sorted(Path(root).glob("*/lib/libcudart.so.*"))] + candidates
    except ImportError:
        pass
    for name in candidates:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def total_ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


class _Chunk:
    """One mapping of the arena: its address, size, free spans (offset -> size, coalesced) and whether pinned."""

    def __init__(self, size: int, cudart: ctypes.CDLL | None) -> None:
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)   # faulted in at once
        self.map = mmap.mmap(-1, size, flags=flags)
        self.size = size
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.free: dict[int, int] = {0: size}
        self.used = 0
        self.pinned = False
        self.pin_error = ""
        if cudart is not None:
            rc = cudart.cudaHostRegister(ctypes.c_void_p(self.address), ctypes.c_size_t(size),
                                         ctypes.c_uint(_CUDA_HOST_REGISTER_PORTABLE))
            self.pinned = rc == 0
            self.pin_error = "" if rc == 0 else f"cudaHostRegister returned {rc}"

    def take(self, nbytes: int) -> int | None:
        for offset, size in self.free.items():        # first fit, in insertion order
            if size >= nbytes:
                del self.free[offset]
                if size > nbytes:
                    self.free[offset + nbytes] = size - nbytes
                self.used += nbytes
                return offset
        return None

    def give(self, offset: int, nbytes: int) -> None:
        self.used -= nbytes
        end = offset + nbytes
        if end in self.free:                          # merge with the span after
            nbytes += self.free.pop(end)
        before = next((o for o, s in self.free.items() if o + s == offset), None)
        if before is not None:                        # and with the span before
            self.free[before] += nbytes
        else:
            self.free[offset] = nbytes

    def release(self, cudart: ctypes.CDLL | None) -> None:
        if self.pinned and cudart is not None:
            cudart.cudaHostUnregister(ctypes.c_void_p(self.address))
        with contextlib.suppress(BufferError):        # a view still exported: the mapping goes with the process
            self.map.close()


class _Lease:
    """Returns a buffer's span to its chunk when the last view of the buffer is gone."""

    __slots__ = ("arena", "chunk", "offset", "nbytes")

    def __init__(self, arena: HostArena, chunk: _Chunk, offset: int, nbytes: int) -> None:
        self.arena, self.chunk, self.offset, self.nbytes = arena, chunk, offset, nbytes

    def __del__(self) -> None:
        self.arena._give(self.chunk, self.offset, self.nbytes)


class HostArena:
    """Host memory for saved K/V blocks: page-locked on a CUDA build (`pin`), else pre-faulted pageable pages, in
    chunks up to `cap_bytes`; `buffer(n)` hands out a writable memoryview, its span free again when the last view
    of it is gone (garbage collection, so no caller frees by hand). None past the cap: the caller allocates. Empty
    chunks stay mapped up to `keep_idle_bytes` (mapping, faulting and pinning a chunk costs more than a save).

    Invariants: `used_bytes` is the bytes of live buffers; chunks hold nothing but live buffers and free spans; a
    chunk left empty is given back past a warm reserve; pinning that fails keeps the chunk pageable, says so once in
    the log and pins nothing more. Thread-safe (a save may fill a buffer on a worker thread)."""

    def __init__(self, cap_bytes: int, *, pin: bool = False, chunk_bytes: int = CHUNK_BYTES,
                 keep_idle_bytes: int = KEEP_IDLE_BYTES) -> None:
        self.cap_bytes = max(0, cap_bytes)
        self.chunk_bytes = chunk_bytes
        self.keep_idle_bytes = keep_idle_bytes
        self._cudart = cuda_runtime() if pin else None
        self.pin_note = "" if not pin or self._cudart is not None else "no CUDA runtime to pin with"
        if pin and self._cudart is None:
            log.info("saved K/V stays in pageable memory: %s", self.pin_note)
        self._chunks: list[_Chunk] = []
        self._lock = threading.Lock()
        self.used_bytes = 0

    @property
    def reserved_bytes(self) -> int:
        return sum(chunk.size for chunk in self._chunks)

    @property
    def pinned_bytes(self) -> int:
        return sum(chunk.size for chunk in self._chunks if chunk.pinned)

    def buffer(self, nbytes: int) -> memoryview | None:
        """A writable view of `nbytes` arena bytes (not zeroed), or None when the cap leaves no room for them."""
        if nbytes <= 0:
            return None
        span = -(-nbytes // ALIGN) * ALIGN
        with self._lock:
            for chunk in self._chunks:
                offset = chunk.take(span)
                if offset is not None:
                    break
            else:
                size = max(self.chunk_bytes, span)
                if self.reserved_bytes + size > self.cap_bytes:
                    return None
                try:
                    chunk = _Chunk(size, self._cudart)
                except (OSError, ValueError) as exc:
                    log.info("the saved K/V arena cannot grow (%s): ordinary allocations", exc)
                    return None
                if self._cudart is not None and not chunk.pinned:
                    self.pin_note = chunk.pin_error
                    log.warning("saved K/V stays in pageable memory: pinning failed (%s)", chunk.pin_error)
                    self._cudart = None
                self._chunks.append(chunk)
                offset = chunk.take(span)
            self.used_bytes += span
        array = (ctypes.c_char * nbytes).from_address(chunk.address + offset)
        array._lease = _Lease(self, chunk, offset, span)     # lives as long as the array, i.e. every view of it
        return memoryview(array).cast("B")

    def _give(self, chunk: _Chunk, offset: int, span: int) -> None:
        with self._lock:
            chunk.give(offset, span)
            self.used_bytes -= span
            if chunk.used == 0:
                idle = sum(c.size for c in self._chunks if c.used == 0)
                if idle > self.keep_idle_bytes:      # past the warm reserve: the pages go back
                    self._chunks.remove(chunk)
                    chunk.release(self._cudart)

    def close(self) -> None:
        """Give back every chunk no live buffer is in (those stay mapped until their last buffer goes)."""
        with self._lock:
            for chunk in [c for c in self._chunks if c.used == 0]:
                chunk.release(self._cudart)
                self._chunks.remove(chunk)


_arena: HostArena | None = None


def host_arena() -> HostArena | None:
    """The process's saved-K/V arena, once `configure_arena` made one."""
    return _arena


def configure_arena(share: float, *, pin: bool, ram_budget_bytes: int | None = None) -> HostArena | None:
    """Make (or keep) the process's arena: `share` of the RAM (capped by `ram_budget_bytes`), pinned when `pin`
    (a CUDA build with a GPU). share 0: no arena, saves allocate as before."""
    global _arena
    cap = int(total_ram_bytes() * max(0.0, share))
    if ram_budget_bytes is not None:
        cap = min(cap, ram_budget_bytes)
    if cap <= 0:
        return None
    if _arena is None or _arena.cap_bytes != cap or (_arena._cudart is not None) != pin:
        if _arena is not None and _arena.used_bytes == 0:
            _arena.close()
        _arena = HostArena(cap, pin=pin)
    return _arena
