"""Bench tools that run without a GPU: the random-weight GGUF in a real model's shape, a system in a
process of its own."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.isolated import IsolatedSystem
from benchmarks.pinned_copy import h2d_copy_ms
from benchmarks.synthetic_model import TINY, write
from evoke_engine.runtime.kv import KVCache
from evoke_engine.runtime.runtime import Runtime
from evoke_engine.settings import Settings


def test_synthetic_model_loads_decodes_and_takes_the_native_reanchor(tmp_path):
    path = write(tmp_path / "tiny.gguf", TINY)
    rt = Runtime(Settings(model_path=str(path), n_ctx=512, slots=1, home=str(tmp_path)))
    try:
        kv = KVCache(rt)
        assert rt.info().n_layer == TINY.n_layer
        geometry = kv.geometry
        assert geometry is not None and (geometry.n_head_kv, geometry.head_dim) == (2, 64)
        rt.decode(rt.tokenize("def main():\n    return 0\n" * 8), 0, 0)
        assert np.isfinite(rt.logits()).all()
    finally:
        rt.close()


def test_pinned_copy_reference_is_absent_without_a_gpu():
    from evoke_engine.runtime import device

    if not device.detect().on_gpu:
        assert h2d_copy_ms(1 << 20) is None


def test_an_isolated_system_answers_in_order_reports_errors_and_ends_with_close():
    system = IsolatedSystem(list, [3, 1, 2])
    try:
        assert system.call("sort") is None and system.call("copy") == [1, 2, 3]
        with pytest.raises(RuntimeError, match="ValueError"):
            system.call("index", 99)
        assert system.call("index", 3) == 2                  # still serving after an error
    finally:
        system.close()
    assert not system._process.is_alive()
    with pytest.raises(RuntimeError, match="ValueError"):
        IsolatedSystem(int, "not a number")


def test_bench_overhead_reports_the_typed_ahead_turns_apart():
    """Issue 44: turns whose message was embedded while typed spend nothing embedding; the others embed theirs."""
    from benchmarks.overhead import run

    result = run(blocks=(50,), turns=6, max_tokens=2, typed_ahead=True, history=2,
                 embedded_ahead=True)["counts"]["50"]                                  # some evicted
    assert result["messages_before"] == 6
    assert result["turns"] == result["typed_ahead"]["turns"] == result["embedded_ahead"]["turns"] == 2
    assert result["typed_ahead"]["embed_s"]["p50"] == 0 and result["embed_s"]["p50"] > 0
    assert result["typed_ahead"]["decide_s"]["p50"] < result["decide_s"]["p50"]      # decided while typed
    assert result["message_embedding_alone_s"]["n"] == 2 and result["message_embedding_alone_s"]["p50"] > 0
