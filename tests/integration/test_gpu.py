"""The model on a GPU: placement, the KV round trip and the re-anchor on CUDA (skipped without one).

The KV checks are the CPU tests of test_engine_kv, collected again here with a GPU runtime, so
both devices are held to the same tolerance.
"""

from __future__ import annotations

import llama_cpp as ll
import pytest

from evoke_engine.runtime.kv import KVCache
from evoke_engine.runtime.runtime import Runtime
from evoke_engine.settings import Settings
from integration.test_engine_kv import (  # noqa: F401  (collected again here, on the GPU rig below)
    clean,
    test_block_restored_at_the_tail_still_answers,
    test_restore_at_a_new_position_matches_llama_cpp_shift,
    test_round_trip_at_original_position_continues_identically,
)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    rt = Runtime(Settings(n_ctx=4096, slots=2, home=str(tmp_path_factory.mktemp("gpu"))))
    assert rt.device.on_gpu, "the GPU rig runs on the CPU"
    kv = KVCache(rt)
    yield rt, kv
    rt.close()


def test_model_and_kv_live_on_the_gpu_by_default(rig):
    rt, _kv = rig
    info = rt.info()
    assert info.device_kind == "cuda" and info.device.startswith("CUDA")
    assert info.n_gpu_layers == ll.llama_model_n_layer(rt.model)       # n_gpu_layers = -1: all of them
    assert info.vram_weights_bytes > 0 and info.vram_kv_bytes > 0
    assert 0 < info.vram_free_bytes <= info.vram_total_bytes
    assert info.device_notice == ""
