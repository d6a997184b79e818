"""Where the files Evoke Desk ships are found, installed (`pip install .`) or run from a checkout: the
resources (system prompt, tool schemas, icons, style sheet) and the native libraries `native/build.sh` builds.

Invariants: resources are read through `importlib.resources` from the installed `evoke_resources` package
(pyproject maps it onto the top-level resources/ folder); only where that package is not installed (a checkout
on PYTHONPATH, a PyInstaller bundle) is resources/ beside this package used. A native library is looked for in
the package's own folder (`native_dir()`, where `bash native/build.sh DIR` puts it for an installed package)
and then in the checkout's native/build/; a missing one is never an error, its callers fall back and say why
with `native_missing_note`. Every native file is named in `NATIVE_FILES`, which the bundle's spec copies from
(`native_library` refuses a name not listed there, so a new library cannot be left out of the bundle again).
"""

from __future__ import annotations

import importlib.resources
from importlib.resources.abc import Traversable
from pathlib import Path

RESOURCES_PACKAGE = "evoke_resources"
ROPE_LIB = "libevoke_rope.so"                 # the RoPE re-anchor (runtime/reanchor.py)
ATTENTION_LIB = "libevoke_attention.so"       # the attention capture (runtime/attention.py)
KV_DIRECT_LIB = "libevoke_kvdirect.so"        # the direct per-layer KV path (runtime/kv_direct.py)
KV_QUANT_LIB = "libevoke_kvquant.so"          # the 8/4-bit host tier's kernels (kvcache/kvquant.py)
RPC_SERVER = "rpc-server"                     # llama.cpp's RPC worker (runtime/rpc_worker.py)
NATIVE_FILES = (ROPE_LIB, ATTENTION_LIB, KV_DIRECT_LIB, KV_QUANT_LIB, RPC_SERVER)
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


def native_library(name: str) -> Path | None:
    """The first `name` (one of `NATIVE_FILES`) in `native_search_dirs()`, or None."""
    if name not in NATIVE_FILES:
        raise ValueError(f"{name} is not in package_files.NATIVE_FILES: list it there so the bundle carries it")
    return next((d / name for d in native_search_dirs() if (d / name).is_file()), None)


def native_missing_note(name: str) -> str:
    looked = " and ".join(str(d) for d in native_search_dirs())
    return (f"{name} not found (looked in {looked}); build it with `bash native/build.sh` in a checkout, or for an "
            f"installed package `bash native/build.sh {native_dir()}`")
