"""`device.load_backends` on a stand-in for ggml's registry: a build whose CPU backend did not load is refused
with a clear message (llama.cpp would crash at the model load), a missing CUDA backend is only a notice."""

from __future__ import annotations

import pytest

from evoke_engine.errors import ModelLoadError
from evoke_engine.runtime import device

pytestmark = pytest.mark.unit


class Registry:
    """ggml's backend registry as `device.ggml_library()` returns it: empty until `ggml_backend_load_all_from_path`."""

    def __init__(self, loadable: list[str]) -> None:
        self.loadable, self.names = loadable, []

    def ggml_backend_reg_count(self) -> int:
        return len(self.names)

    def ggml_backend_load_all_from_path(self, path: bytes) -> None:
        self.names = list(self.loadable)

    def ggml_backend_reg_get(self, i: int) -> int:
        return i

    def ggml_backend_reg_name(self, i: int) -> bytes:
        return self.names[i].encode()


@pytest.fixture(autouse=True)
def fresh_cache():
    device.load_backends.cache_clear()          # loaded once per process: neither see nor leave a cached answer
    yield
    device.load_backends.cache_clear()


def _patch(monkeypatch, loadable: list[str], *, cuda: bool) -> None:
    registry = Registry(loadable)
    monkeypatch.setattr(device, "ggml_library", lambda: registry)
    monkeypatch.setattr(device, "cuda_build", lambda: cuda)
    monkeypatch.setattr(device, "_preload_nvidia_runtime", lambda: None)


def _load(monkeypatch, loadable: list[str], *, cuda: bool) -> str:
    device.load_backends.cache_clear()
    _patch(monkeypatch, loadable, cuda=cuda)
    return device.load_backends()


def test_a_build_without_its_cpu_backend_is_refused_with_the_reason(monkeypatch):
    _patch(monkeypatch, ["CUDA", "RPC"], cuda=True)
    for _ in range(2):            # a retry, with the CUDA and RPC backends registered by now, is refused too
        with pytest.raises(ModelLoadError, match=r"CPU backend did not load .*loaded: CUDA, RPC.*make gpu"):
            device.load_backends()


def test_a_cuda_build_without_its_cuda_backend_runs_on_the_cpu_with_a_notice(monkeypatch):
    assert "CUDA backend did not load" in _load(monkeypatch, ["CPU", "RPC"], cuda=True)
    assert _load(monkeypatch, ["CPU", "CUDA", "RPC"], cuda=True) == ""
    assert _load(monkeypatch, ["CPU"], cuda=False) == ""
