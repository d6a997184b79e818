"""Issue 62: each portable CPU variant of the native libraries loads and computes what this CPU's own build does.
Every variant the CPU runs is forced in its own process (EVOKE_NATIVE_VARIANT); the baseline one has no AVX code,
so passing here is what a CPU without AVX-512 or AMX (or AVX) gets from the bundle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evoke_engine import package_files as pf

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "native" / "build"
SOURCES = [ROOT / "native" / name for name in ("build.sh", "build_variants.sh", "rope_reanchor.c", "kvquant.c",
                                               "attention_capture.cpp", "kv_direct.cpp")]

# What each forced variant computes: its libraries as the engine finds them, the 8/4-bit kernels agreeing with numpy
# (kvquant checks on load), the RoPE re-anchor and the packed bytes of test_kvquant's state blob, Ada-KV's picks.
PROBE = """
import hashlib, json, sys
import numpy as np
sys.path.insert(0, "tests/unit")
from test_kvquant import GEOMETRY, state_blob
from evoke_engine import package_files
from evoke_engine.kvcache import kvquant
from evoke_engine.runtime import attention, kv_direct, reanchor

digest = lambda *parts: hashlib.sha256(b"".join(bytes(p) for p in parts)).hexdigest()
blob = state_blob(40, v_trans=True, seed=3)
shifted = bytearray(blob)
reanchor.shift(shifted, reanchor.parse(shifted, GEOMETRY), GEOMETRY, 37)
weights = np.random.default_rng(5).random((4, 96)).astype(np.float32)
picks, counts = attention.adakv(weights / weights.sum(axis=1, keepdims=True), per_head_budget=20)
print(json.dumps({
    "variants": {name: found and found["variant"] for name, found in package_files.native_report().items()},
    "loaded": [reanchor.available(), kv_direct.available(), kvquant.native_kernels()],
    "rope": digest(shifted), "kvquant": digest(kvquant.pack(blob, 8), kvquant.pack(blob, 4)),
    "adakv": digest(picks.tobytes(), counts.tobytes()),
}))
"""

# The direct KV path on the embedded model: calibrated (its fused re-anchor matched llama.cpp's shift) and a
# direct save byte for byte llama.cpp's own serialisation.
MODEL_PROBE = """
import json, sys
from evoke_engine.runtime.kv import KVCache
from evoke_engine.runtime.runtime import Runtime
from evoke_engine.settings import Settings

rt = Runtime(Settings(n_ctx=1024, slots=1, slot_layout="contexts", home=sys.argv[1]))   # the serialised path too
kv = KVCache(rt)
rt.decode(rt.tokenize("Line one: the pump in room 4 runs quietly. " * 8), 0, 0, logits_last=False)
before = kv.direct_saves
direct = bytes(kv.save(0, 10, 60).data)
kv.use_direct = False
print(json.dumps({"note": kv.direct_note, "direct_saves": kv.direct_saves - before,
                  "same": direct == bytes(kv.save(0, 10, 60).data)}))
rt.close()
"""


def run_forced(variant: str, code: str, *args: str) -> dict:
    env = {**os.environ, pf.VARIANT_ENV: variant}
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def variants() -> list[str]:
    """The portable variants this CPU runs, built (native/build_variants.sh, ~20 s) where missing or stale."""
    newest = max(source.stat().st_mtime for source in SOURCES)
    built = [BUILD / variant / name for variant, _ in pf.CPU_VARIANTS for name in pf.NATIVE_LIBRARIES]
    if any(not path.is_file() or path.stat().st_mtime < newest for path in built):
        done = subprocess.run(["bash", str(ROOT / "native" / "build_variants.sh")], capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
    runnable = [variant for variant in pf.runnable_variants() if variant != pf.NATIVE]
    assert pf.BASELINE in runnable
    return runnable


def test_every_variant_the_cpu_runs_loads_and_computes_as_the_native_build(variants):
    results = {variant: run_forced(variant, PROBE) for variant in variants}
    if all((BUILD / name).is_file() for name in pf.NATIVE_LIBRARIES):
        results[pf.NATIVE] = run_forced(pf.NATIVE, PROBE)
    reference = results.get(pf.NATIVE, results[pf.BASELINE])
    for variant, result in results.items():
        assert set(result["variants"].values()) == {variant}, result["variants"]   # no library from another one
        assert result["loaded"] == [True, True, True], variant
        assert {k: result[k] for k in ("rope", "kvquant", "adakv")} == \
            {k: reference[k] for k in ("rope", "kvquant", "adakv")}, variant


def test_the_direct_kv_path_runs_on_the_baseline_variant(variants, tmp_path):
    result = run_forced("baseline", MODEL_PROBE, str(tmp_path))
    assert result == {"note": "", "direct_saves": 1, "same": True}


def test_the_device_report_names_the_forced_variant_of_each_library(variants, tmp_path):
    env = {**os.environ, pf.VARIANT_ENV: "baseline", "EVOKE_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "evoke_engine", "device"], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {name: found["variant"] for name, found in report["native_libraries"].items()} == \
        dict.fromkeys(pf.NATIVE_LIBRARIES, pf.BASELINE)
    assert report["kv_direct_loaded"] and report["kv_quant_native"]
