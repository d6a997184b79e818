"""Issue 62: the native libraries' CPU variants. A library comes from this CPU's own build where there is one, else
from the best portable variant whose flags the CPU reports, never one it lacks; EVOKE_NATIVE_VARIANT forces one;
the bundle carries every portable variant and not the -march=native build."""

from __future__ import annotations

from pathlib import Path

import pytest

from evoke_engine import package_files as pf

V3 = dict(pf.CPU_VARIANTS)["x86-64-v3"]
V4 = dict(pf.CPU_VARIANTS)["x86-64-v4"]


@pytest.fixture()
def cpu(monkeypatch):
    """Set the CPU's flags: cpu(flags)."""
    monkeypatch.delenv(pf.VARIANT_ENV, raising=False)
    monkeypatch.setattr(pf.platform, "machine", lambda: "x86_64")

    def set_flags(flags: frozenset[str]) -> None:
        monkeypatch.setattr(pf, "cpu_flags", lambda: flags)
    return set_flags


@pytest.fixture()
def folders(tmp_path, monkeypatch):
    """Two search folders (the package's, the checkout's) and a way to put a library in one variant of one."""
    dirs = [tmp_path / "package", tmp_path / "checkout"]
    monkeypatch.setattr(pf, "native_search_dirs", lambda: dirs)

    def put(folder: int, variant: str, name: str = pf.KV_QUANT_LIB) -> Path:
        path = dirs[folder] / name if variant == pf.NATIVE else dirs[folder] / variant / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\x7fELF")
        return path
    return put


def test_the_variants_a_cpu_runs_follow_its_flags_best_first(cpu):
    cpu(V4 | {"sse4_2"})
    assert pf.runnable_variants() == ["native", "x86-64-v4", "x86-64-v3", "x86-64"]
    cpu(V3)
    assert pf.runnable_variants() == ["native", "x86-64-v3", "x86-64"]
    cpu(V4 - {"avx512bw"})                                   # AVX-512F alone is not x86-64-v4
    assert pf.runnable_variants() == ["native", "x86-64-v3", "x86-64"]
    cpu(frozenset())
    assert pf.runnable_variants() == ["native", "x86-64"]


def test_no_x86_variant_is_offered_on_another_architecture(cpu, monkeypatch):
    cpu(V4)
    monkeypatch.setattr(pf.platform, "machine", lambda: "aarch64")
    assert pf.runnable_variants() == ["native"]


def test_the_native_build_comes_first_then_the_best_variant_the_cpu_runs(cpu, folders):
    cpu(V3)
    v4 = folders(0, "x86-64-v4")
    v3 = folders(1, "x86-64-v3")
    baseline = folders(0, "x86-64")
    assert pf.native_library(pf.KV_QUANT_LIB) == v3             # never the AVX-512 build on an AVX2 CPU
    cpu(V4)
    assert pf.native_library(pf.KV_QUANT_LIB) == v4
    native = folders(1, pf.NATIVE)
    assert pf.native_library(pf.KV_QUANT_LIB) == native
    assert [pf.native_variant(p) for p in (v4, v3, baseline, native)] == ["x86-64-v4", "x86-64-v3", "x86-64",
                                                                           "native"]


def test_the_variant_can_be_forced_to_the_baseline(cpu, folders, monkeypatch):
    cpu(V4)
    folders(0, pf.NATIVE)
    folders(0, "x86-64-v4")
    baseline = folders(1, "x86-64")
    monkeypatch.setenv(pf.VARIANT_ENV, "baseline")
    assert pf.variant_order() == ["x86-64"]
    assert pf.native_library(pf.KV_QUANT_LIB) == baseline
    monkeypatch.setenv(pf.VARIANT_ENV, "x86-64-v3")
    assert pf.native_library(pf.KV_QUANT_LIB) is None          # forced and not built: missing, no other taken
    report = pf.native_report()
    assert set(report) == set(pf.NATIVE_LIBRARIES) and report[pf.KV_QUANT_LIB] is None


def test_a_variant_the_cpu_lacks_or_an_unknown_name_is_refused_with_the_runnable_ones(cpu, monkeypatch):
    cpu(V3)
    for wrong in ("x86-64-v4", "avx9"):
        monkeypatch.setenv(pf.VARIANT_ENV, wrong)
        with pytest.raises(ValueError, match=f"{pf.VARIANT_ENV}={wrong}: this CPU runs native, x86-64-v3, x86-64"):
            pf.variant_order()


def test_rpc_server_is_one_build_whatever_the_variant(cpu, folders, monkeypatch):
    cpu(V4)
    server = folders(1, pf.NATIVE, pf.RPC_SERVER)
    monkeypatch.setenv(pf.VARIANT_ENV, "baseline")
    assert pf.native_library(pf.RPC_SERVER) == server


def test_the_report_names_each_librarys_variant_and_path(cpu, folders):
    cpu(V3)
    rope = folders(1, "x86-64", pf.ROPE_LIB)
    report = pf.native_report()
    assert report[pf.ROPE_LIB] == {"variant": "x86-64", "path": str(rope)}
    assert report[pf.KV_DIRECT_LIB] is None


def test_the_bundle_carries_every_variant_of_every_library_and_not_the_native_build(tmp_path):
    files = pf.bundle_native_files(tmp_path)
    build = tmp_path / "native" / "build"
    expected = {(build / variant / name, f"native/build/{variant}") for variant, _ in pf.CPU_VARIANTS
                for name in pf.NATIVE_LIBRARIES}
    assert set(files) == expected | {(build / pf.RPC_SERVER, "native/build")}
    assert len(files) == len(pf.CPU_VARIANTS) * len(pf.NATIVE_LIBRARIES) + 1
    assert pf.BASELINE in dict(pf.CPU_VARIANTS) and dict(pf.CPU_VARIANTS)[pf.BASELINE] == frozenset()
