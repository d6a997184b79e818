"""How this process's allocator holds the large buffers that saved K/V lives in (glibc's malloc).

Invariants: applied at most once per process, before the pool holds bytes; a no-op (False) where the C
library is not glibc; never changes a buffer's contents, only where its pages come from and when they go back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3            # glibc's mallopt parameter (malloc.h)
LARGE_BUFFER_BYTES = 1 << 20     # a saved block is 0.7-3 MB for the embedded model, tens of MB for a 7B one
_applied: bool | None = None


def map_large_buffers() -> bool:
    """Give every allocation of `LARGE_BUFFER_BYTES` or more a mapping of its own, returned to the OS when
    freed. By default glibc raises its mmap threshold to the size of the first large buffer freed (up to 32
    MiB): from then on saved blocks come from the heap, and the ones freed after a splice or a spill stay in it
    as holes that later blocks rarely fit. Setting the threshold turns that adjustment off."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        _applied = bool(libc.mallopt(M_MMAP_THRESHOLD, LARGE_BUFFER_BYTES))
    except (OSError, AttributeError) as exc:
        log.info("mallopt unavailable (%s): large buffers stay with the allocator's defaults", exc)
    return _applied
