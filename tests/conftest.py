"""Shared fixtures: one real runtime and one engine per test session, isolated dirs, Qt offscreen."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def evoke_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("evoke-home")
    os.environ["EVOKE_HOME"] = str(home)
    return home


def _gpu_available() -> bool:
    """A CUDA (or other offload) build of llama.cpp with a device to offload to."""
    try:
        import llama_cpp

        return bool(llama_cpp.llama_supports_gpu_offload())
    except Exception:  # noqa: BLE001 - no usable build means no GPU
        return False


def pytest_collection_modifyitems(config, items):
    """`gpu` tests skip (with the reason) where llama.cpp cannot offload to a GPU."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items and not _gpu_available():
        skip = pytest.mark.skip(reason="needs a GPU build of llama.cpp and a GPU")
        for item in gpu_items:
            item.add_marker(skip)
