"""Which device llama.cpp computes on: loads run-time backends, picks CUDA or the CPU, says why (remote devices:
rpc.py, rpc_placement.py), and the memory the GPU and this machine have free (for fit.py).

Invariants: backends are loaded once per process, before the first model load; a CUDA build on a
machine without a GPU or driver falls back to the CPU with a notice and never raises at import; the automatic
thread count never exceeds the physical cores this process may use, nor the cores other work leaves idle.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as ll

from ..errors import ModelLoadError

LLAMA_LIB_DIR = Path(ll.__file__).resolve().parent / "lib"
_GPU_TYPES = {1, 2}                  # GGML_BACKEND_DEVICE_TYPE_GPU, _IGPU
_NVIDIA_LIBS = ("libcudart.so", "libcublasLt.so", "libcublas.so")


def physical_cores(cpus: set[int] | None = None) -> int:
    """Physical cores among the CPUs this process may run on (SMT siblings counted once)."""
    cpus = cpus if cpus is not None else set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(
        range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        try:
            siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
        except OSError:
            siblings = str(cpu)
        cores.add(siblings)
    return max(1, len(cores))


def auto_threads(cpus: set[int] | None = None, load: float | None = None) -> int:
    """Decode threads for `n_threads = 0`: the physical cores, less those the load average says are busy.
    llama.cpp's threads spin while they wait, so one thread more than the idle cores slows every token
    (6-10x measured on a busy 2-core machine), while one fewer costs at most its share."""
    cpus = cpus if cpus is not None else set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(
        range(os.cpu_count() or 1))
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:
            load = 0.0
    idle = len(cpus) - int(load)
    return max(1, min(physical_cores(cpus), idle))


@dataclass(frozen=True)
class DeviceInfo:
    """The device the model will use, what the llama.cpp build offers, and any fallback notice."""

    kind: str                    # "cuda" or "cpu"
    name: str                    # "CUDA0", "CPU"
    description: str             # "NVIDIA GeForce RTX 4090", the CPU model
    build: str                   # "cuda" when the installed llama.cpp carries the CUDA backend
    vram_total_bytes: int = 0
    vram_free_bytes: int = 0
    notice: str = ""             # why a CUDA build runs on the CPU, or why the GPU was not used
    ram_total_bytes: int = 0     # this machine's memory (0: unknown)
    ram_available_bytes: int = 0     # what the kernel could give without swapping (MemAvailable), when detected

    @property
    def on_gpu(self) -> bool:
        return self.kind == "cuda"

    def label(self) -> str:
        return f"{self.name} ({self.description})" if self.description else self.name


def host_memory(meminfo: Path = Path("/proc/meminfo")) -> tuple[int, int]:
    """(available, total) bytes of this machine's memory: MemAvailable and MemTotal, else the page counts
    (available then counts free pages only); (0, 0) where neither can be read."""
    try:
        fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
        kib = {key: int(value.split()[0]) * 1024 for key, value in fields.items() if value.split()}
        return kib.get("MemAvailable", kib.get("MemFree", 0)), kib.get("MemTotal", 0)
    except (OSError, ValueError):
        pass
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
    except (OSError, ValueError, AttributeError):
        return 0, 0


def ggml_library() -> ctypes.CDLL:
    """ggml's registry as libllama sees it: symbols looked up through libllama's own handle, because
    the wheel ships libggml.so and libggml.so.0 as separate copies (two registries if both load)."""
    lib = ctypes.CDLL(str(LLAMA_LIB_DIR / "libllama.so"))
    lib.ggml_backend_reg_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_get.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_reg_name.restype = ctypes.c_char_p
    lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for fn in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(lib, fn).restype = ctypes.c_char_p
        getattr(lib, fn).argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                            ctypes.POINTER(ctypes.c_size_t)]
    return lib


def cuda_build() -> bool:
    """Whether the installed llama-cpp-python carries the CUDA backend (linked in or loadable)."""
    return any(LLAMA_LIB_DIR.glob("libggml-cuda.so*"))


def nvidia_library_dirs() -> list[Path]:
    """The library folders of PyPI's NVIDIA packages (CUDA runtime, cuBLAS) in site-packages or the bundle."""
    roots = [Path(getattr(sys, "_MEIPASS", "")) / "nvidia"] if getattr(sys, "frozen", False) else []
    try:
        import nvidia
        roots += [Path(p) for p in getattr(nvidia, "__path__", [])]
    except ImportError:
        pass
    return [lib_dir for root in roots
            for lib_dir in sorted(Path(root).glob("cu*/lib")) + sorted(Path(root).glob("*/lib"))]


def _preload_nvidia_runtime() -> None:
    """Load the CUDA runtime and cuBLAS that PyPI's NVIDIA packages put in site-packages, so the
    CUDA backend finds them without LD_LIBRARY_PATH (as torch does). Missing ones are skipped."""
    for lib_dir in nvidia_library_dirs():
        for stem in _NVIDIA_LIBS:
            for path in sorted(lib_dir.glob(stem + ".*")):
                with contextlib.suppress(OSError):
                    ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)


@functools.lru_cache(maxsize=1)
def load_backends() -> str:
    """Register llama.cpp's backends (a build with run-time backends has none until this);
    EVOKE_GPU=cpu hides the GPUs first. Returns a notice when the CUDA backend did not load; ModelLoadError when
    the CPU backend did not (a CUDA wheel built without its CPU modules: llama.cpp would crash at the model load)."""
    if os.environ.get("EVOKE_GPU", "").lower() == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    lib = ggml_library()
    if lib.ggml_backend_reg_count() == 0:           # run-time backends (none linked in): load them once
        if cuda_build():
            _preload_nvidia_runtime()
        lib.ggml_backend_load_all_from_path(str(LLAMA_LIB_DIR).encode())
    names = {lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)).decode()
             for i in range(lib.ggml_backend_reg_count())}
    if "CPU" not in names:      # llama.cpp would crash loading a model without it; every later call refuses too
        raise ModelLoadError(f"llama.cpp's CPU backend did not load from {LLAMA_LIB_DIR} (loaded: "
                             f"{', '.join(sorted(names)) or 'none'}): this llama-cpp-python build lacks its "
                             "libggml-cpu modules; reinstall it with `make install` (CPU) or `make gpu` (CUDA)")
    if cuda_build() and "CUDA" not in names:
        return ("the CUDA backend did not load (no CUDA runtime or cuBLAS libraries found: "
                "run `make gpu`); running on the CPU")
    return ""


def detect() -> DeviceInfo:
    """The device a model loaded now would use (the first GPU llama.cpp lists, else the CPU)."""
    load_notice = load_backends()
    lib = ggml_library()
    build = "cuda" if cuda_build() else "cpu"
    ram_available, ram_total = host_memory()
    cpu_desc = ""
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        kind = lib.ggml_backend_dev_type(dev)
        name = lib.ggml_backend_dev_name(dev).decode()
        desc = lib.ggml_backend_dev_description(dev).decode().strip()
        if kind in _GPU_TYPES and name.upper().startswith("CUDA"):
            free, total = ctypes.c_size_t(), ctypes.c_size_t()
            lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            return DeviceInfo("cuda", name, desc, build, total.value, free.value,
                              ram_total_bytes=ram_total, ram_available_bytes=ram_available)
        if kind == 0 and not cpu_desc:
            cpu_desc = desc
    notice = load_notice
    if build == "cuda" and not notice:
        if os.environ.get("EVOKE_GPU", "").lower() == "cpu":
            notice = "EVOKE_GPU=cpu: the GPU is not used"
        elif os.environ.get("CUDA_VISIBLE_DEVICES") == "":
            notice = "no GPU visible (CUDA_VISIBLE_DEVICES is empty); running on the CPU"
        else:
            notice = "CUDA build, but no GPU or NVIDIA driver found; running on the CPU"
    return DeviceInfo("cpu", "CPU", cpu_desc, build, notice=notice, ram_total_bytes=ram_total,
                      ram_available_bytes=ram_available)


def capabilities() -> dict[str, bool]:
    """What the installed llama.cpp can do here: offload layers to a GPU, reach remote devices (RPC)."""
    return {"gpu_offload": bool(ll.llama_supports_gpu_offload()), "rpc_backend": bool(ll.llama_supports_rpc())}
