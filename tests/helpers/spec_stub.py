"""packaging/evoke-desk.spec run against stub PyInstaller objects: what it passed to each, nothing built.

Invariants: the real PyInstaller modules (if any) are back in sys.modules afterwards; the stubs find only the
dynamic libraries and analysis binaries a test gives them.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]


def run_spec(root: Path, *, dynamic_libs: Callable[[str], list[tuple[str, str]]] = lambda package: [],
             analysis_binaries: list[tuple[str, str, str]] = ()) -> dict:
    """{"Analysis"|"PYZ"|"EXE"|"COLLECT": (args, kwargs)} of one run of the spec with SPECPATH under `root`."""
    seen: dict = {}
    hooks = types.ModuleType("PyInstaller.utils.hooks")
    hooks.collect_dynamic_libs = lambda package, *a, **k: dynamic_libs(package)
    hooks.collect_data_files = hooks.collect_submodules = hooks.copy_metadata = lambda *a, **k: []
    modules = {"PyInstaller": types.ModuleType("PyInstaller"),
               "PyInstaller.utils": types.ModuleType("PyInstaller.utils"), "PyInstaller.utils.hooks": hooks}

    def record(name):
        def build(*args, **kwargs):
            seen[name] = (args, kwargs)
            return SimpleNamespace(pure=[], scripts=[], binaries=list(analysis_binaries), datas=[])
        return build
    namespace = {"SPECPATH": str(root / "packaging"), **{n: record(n) for n in ("Analysis", "PYZ", "EXE", "COLLECT")}}
    saved = {k: sys.modules.get(k) for k in modules}
    sys.modules.update(modules)
    try:
        exec(compile((ROOT / "packaging" / "evoke-desk.spec").read_text(), "evoke-desk.spec", "exec"), namespace)
    finally:
        for key, module in saved.items():
            if module is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = module
    return seen
