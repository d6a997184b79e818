"""Where the files Evoke Desk ships are found, installed (`pip install .`) or run from a checkout: the
resources (system prompt, tool schemas, icons, style sheet) and the native libraries `native/build.sh` builds.

Invariants: resources are read through `importlib.resources` from the installed `evoke_resources` package
(pyproject maps it onto the top-level resources/ folder); only where that package is not installed (a checkout
on PYTHONPATH, a PyInstaller bundle) is resources/ beside this package used. A native library is looked for in
the package's own folder (`native_dir()`, where `bash native/build.sh DIR` puts it for an installed package)
and then in the checkout's native/build/; a missing one is never an error, its callers fall back and say why
with `native_missing_note`. Every native file is named in `NATIVE_FILES`, which the bundle's spec copies from
(`native_library` refuses a name not listed there, so a new library cannot be left out of the bundle again).
Each of `NATIVE_LIBRARIES` is taken from this CPU's own build (-march=native, the folder itself) where there is
one, else from the best of `CPU_VARIANTS` (a subfolder each, the bundle's set) whose flags the CPU reports; a
variant the CPU lacks is never picked, and EVOKE_NATIVE_VARIANT forces one runnable variant (`baseline`).
"""

from __future__ import annotations

import functools
import importlib.resources
import os
import platform
from importlib.resources.abc import Traversable
from pathlib import Path

RESOURCES_PACKAGE = "evoke_resources"
ROPE_LIB = "libevoke_rope.so"                 # the RoPE re-anchor (runtime/reanchor.py)
ATTENTION_LIB = "libevoke_attention.so"       # the attention capture (runtime/attention.py)
KV_DIRECT_LIB = "libevoke_kvdirect.so"        # the direct per-layer KV path (runtime/kv_direct.py)
KV_QUANT_LIB = "libevoke_kvquant.so"          # the 8/4-bit host tier's kernels (kvcache/kvquant.py)
RPC_SERVER = "rpc-server"                     # llama.cpp's RPC worker (runtime/rpc_worker.py)
NATIVE_LIBRARIES = (ROPE_LIB, ATTENTION_LIB, KV_DIRECT_LIB, KV_QUANT_LIB)   # built per CPU variant
NATIVE_FILES = (*NATIVE_LIBRARIES, RPC_SERVER)
# The portable builds of NATIVE_LIBRARIES, best first: (the -march each is built with and its subfolder's name, the
# /proc/cpuinfo flags it needs). `bash native/build_variants.sh` builds them; the bundle carries these, not NATIVE.
_V3_FLAGS = frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"})
CPU_VARIANTS = (("x86-64-v4", _V3_FLAGS | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}),
                ("x86-64-v3", _V3_FLAGS),
                ("x86-64", frozenset()))
BASELINE = "x86-64"                           # any x86-64 CPU: EVOKE_NATIVE_VARIANT=baseline
NATIVE = "native"                             # the build tuned for this CPU, in the native folder itself
VARIANT_ENV = "EVOKE_NATIVE_VARIANT"
_BESIDE = Path(__file__).resolve().parent.parent          # the checkout root, or a PyInstaller bundle's folder


def resources_root() -> Traversable:
    """The resources folder: the installed `evoke_resources` package, else resources/ beside this package."""
    try:
        return importlib.resources.files(RESOURCES_PACKAGE)
    except ModuleNotFoundError:
        return _BESIDE / "resources"


def resources_path() -> Path:
    """`resources_root()` as a folder on disk (Qt wants file names; setuptools installs the files unzipped)."""
    root = resources_root()
    return root if isinstance(root, Path) else Path(str(root))


def native_dir() -> Path:
    """The package's own folder for native libraries: build into it with `bash native/build.sh DIR`."""
    return Path(__file__).resolve().parent / "native"


def native_search_dirs() -> list[Path]:
    return [native_dir(), _BESIDE / "native" / "build"]


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux reports them (empty where /proc/cpuinfo has none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            line = next((line for line in info if line.startswith("flags")), "")
    except OSError:
        line = ""
    return frozenset(line.partition(":")[2].split())


def runnable_variants() -> list[str]:
    """NATIVE, then the `CPU_VARIANTS` this CPU runs, best first (none on a CPU that is not x86-64)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return [NATIVE]
    return [NATIVE, *(name for name, needs in CPU_VARIANTS if needs <= cpu_flags())]


def variant_order() -> list[str]:
    """The variants a native library is looked for in, in order: EVOKE_NATIVE_VARIANT's alone where it is set."""
    forced = os.environ.get(VARIANT_ENV, "").strip()
    runnable = runnable_variants()
    if not forced:
        return runnable
    forced = BASELINE if forced == "baseline" else forced
    if forced not in runnable:
        raise ValueError(f"{VARIANT_ENV}={forced}: this CPU runs {', '.join(runnable)} (baseline is {BASELINE})")
    return [forced]


def native_library(name: str) -> Path | None:
    """The first `name` (one of `NATIVE_FILES`) in `native_search_dirs()`, by `variant_order()`, or None."""
    if name not in NATIVE_FILES:
        raise ValueError(f"{name} is not in package_files.NATIVE_FILES: list it there so the bundle carries it")
    variants = variant_order() if name in NATIVE_LIBRARIES else [NATIVE]
    folders = (d if variant == NATIVE else d / variant for variant in variants for d in native_search_dirs())
    return next((folder / name for folder in folders if (folder / name).is_file()), None)


def native_variant(path: Path) -> str:
    """The variant a path from `native_library` is: one of `CPU_VARIANTS`' names, or NATIVE."""
    return path.parent.name if path.parent.name in dict(CPU_VARIANTS) else NATIVE


def native_report() -> dict[str, dict[str, str] | None]:
    """Each of `NATIVE_LIBRARIES` as `native_library` finds it: its variant and path, or None (missing)."""
    found = {name: native_library(name) for name in NATIVE_LIBRARIES}
    return {name: path and {"variant": native_variant(path), "path": str(path)} for name, path in found.items()}


def bundle_native_files(root: Path) -> list[tuple[Path, str]]:
    """What the bundle carries from checkout `root`, as (file, folder in the bundle): every `CPU_VARIANTS` build
    of `NATIVE_LIBRARIES` (the -march=native one stays behind) and the other `NATIVE_FILES`."""
    build = root / "native" / "build"
    files = [(build / variant / name, f"native/build/{variant}") for variant, _ in CPU_VARIANTS
             for name in NATIVE_LIBRARIES]
    return files + [(build / name, "native/build") for name in NATIVE_FILES if name not in NATIVE_LIBRARIES]


def native_missing_note(name: str) -> str:
    looked = " and ".join(str(d) for d in native_search_dirs())
    return (f"{name} not found (looked in {looked}); build it with `bash native/build.sh` in a checkout, or for an "
            f"installed package `bash native/build.sh {native_dir()}`")
