"""Issue 62: the CUDA bundle's spec (EVOKE_BUNDLE_KIND=cuda, `make bundle-cuda`) carries llama.cpp's CUDA backend and
PyPI's CUDA runtime and cuBLAS (only those of the NVIDIA packages), stops when one is missing, and keeps one copy of
each: the one in nvidia/cu*/lib/ the engine preloads, not the one PyInstaller finds through the system's loader cache.
Read with stub PyInstaller objects: nothing is built."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.spec_stub import run_spec

from evoke_engine.package_files import bundle_native_files

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SITE = "/venv/lib/python3.11/site-packages"
NVIDIA = [f"{SITE}/nvidia/cu13/lib/{name}" for name in
          ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libnvrtc.so.13", "libnvblas.so.13")]
CUDA_BACKEND = f"{SITE}/llama_cpp/lib/libggml-cuda.so"
FOUND_BY_ANALYSIS = [("libcudart.so.13", "/usr/local/cuda/lib/libcudart.so.13", "BINARY"),    # the loader cache's
                     ("libcublasLt.so.13", "/usr/local/cuda/lib/libcublasLt.so.13", "BINARY"),
                     ("nvidia/cu13/lib/libcudart.so.13", NVIDIA[0], "BINARY"),
                     ("libQt6Core.so.6", "/qt/libQt6Core.so.6", "BINARY")]


def read_spec(root: Path, nvidia: list[str], llama: list[str]) -> dict:
    """Run the spec against stub PyInstaller objects whose collect_dynamic_libs finds `nvidia` and `llama`."""
    found = {"nvidia": nvidia, "llama_cpp": llama}
    return run_spec(root, analysis_binaries=FOUND_BY_ANALYSIS,
                    dynamic_libs=lambda package: [(p, str(Path(p).parent.relative_to(SITE)))
                                                  for p in found.get(package, [])])


@pytest.fixture
def native_root(tmp_path: Path) -> Path:
    for path, _ in bundle_native_files(tmp_path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\x7fELF")
    return tmp_path


def test_the_cuda_bundle_carries_the_runtime_and_cublas_once(native_root, monkeypatch):
    monkeypatch.setenv("EVOKE_BUNDLE_KIND", "cuda")
    seen = read_spec(native_root, NVIDIA, [CUDA_BACKEND])
    binaries = seen["Analysis"][1]["binaries"]
    assert (CUDA_BACKEND, "llama_cpp/lib") in binaries
    assert [p for p, _ in binaries if "/nvidia/" in p] == NVIDIA[:3]          # not nvrtc, nvblas
    collected = [entry[0] for entry in seen["COLLECT"][0][1]]
    assert collected == ["nvidia/cu13/lib/libcudart.so.13", "libQt6Core.so.6"]   # the loader cache's copies gone


@pytest.mark.parametrize("gone", ["libcublasLt.so.13", "libggml-cuda.so"])
def test_the_cuda_bundle_is_not_built_without_its_cuda_libraries(native_root, monkeypatch, gone):
    monkeypatch.setenv("EVOKE_BUNDLE_KIND", "cuda")
    nvidia = [p for p in NVIDIA if not p.endswith(gone)]
    llama = [] if gone == "libggml-cuda.so" else [CUDA_BACKEND]
    with pytest.raises(SystemExit, match=gone.split(".")[0]):
        read_spec(native_root, nvidia, llama)


def test_the_cpu_bundle_needs_no_nvidia_package(native_root, monkeypatch):
    monkeypatch.delenv("EVOKE_BUNDLE_KIND", raising=False)
    seen = read_spec(native_root, [], [])
    assert not [p for p, _ in seen["Analysis"][1]["binaries"] if "nvidia" in p]
    assert len(seen["COLLECT"][0][1]) == len(FOUND_BY_ANALYSIS)           # nothing dropped
