"""The physical limit a GPU restore is held to: a plain pinned host-to-device copy of the same bytes.

Invariant: runs only where the CUDA runtime and a GPU are present (it returns None elsewhere);
buffers are freed before it returns.
"""

from __future__ import annotations

import ctypes
import statistics
import time

from evoke_engine.runtime.host_arena import cuda_runtime

_H2D = 1   # cudaMemcpyHostToDevice


def h2d_copy_ms(nbytes: int, trials: int = 7) -> float | None:
    """Median milliseconds of one cudaMemcpy of `nbytes` from pinned host memory to the GPU."""
    rt = cuda_runtime()
    if rt is None or nbytes <= 0:
        return None
    count = ctypes.c_int(0)
    if rt.cudaGetDeviceCount(ctypes.byref(count)) != 0 or count.value == 0:
        return None
    host, dev = ctypes.c_void_p(), ctypes.c_void_p()
    if rt.cudaMallocHost(ctypes.byref(host), ctypes.c_size_t(nbytes)) != 0:
        return None
    try:
        if rt.cudaMalloc(ctypes.byref(dev), ctypes.c_size_t(nbytes)) != 0:
            return None
        try:
            times = []
            for _ in range(trials + 1):                    # the first copy warms the path up
                rt.cudaDeviceSynchronize()
                start = time.perf_counter()
                rt.cudaMemcpy(dev, host, ctypes.c_size_t(nbytes), _H2D)
                rt.cudaDeviceSynchronize()
                times.append((time.perf_counter() - start) * 1000)
            return statistics.median(times[1:])
        finally:
            rt.cudaFree(dev)
    finally:
        rt.cudaFreeHost(host)
