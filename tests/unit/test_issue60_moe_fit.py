"""Issue 60, a mixture of experts weighed as one: Qwen3-Coder-30B-A3B's stated shape (48 layers, width 2048, 32 query
and 4 KV heads of 128, 128 routed experts of width 768, 8 used a token; its config.json) at Q4_K_M (18.6 GB) holds
30.5B parameters of which 3.35B are active; every expert is placed where its layer goes (llama.cpp without
`--n-cpu-moe`), and the decode speed is that of the bytes a token reads. A GGUF's own expert tensors (`ffn_*_exps`)
are found in its header. No model is loaded and no GPU is needed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evoke_engine.models.catalogue import load_catalogue
from evoke_engine.models.fit_marks import stated_shape
from evoke_engine.runtime.fit import CPU, FITS, GIB, PARTIAL, LoadShape, fit
from evoke_engine.runtime.gguf_shape import ModelShape, shape_of

pytestmark = pytest.mark.unit

GB = 10**9
QWEN3_CODER_30B_A3B = dict(file_bytes=int(18.6 * GB), n_layer=48, n_embd=2048, n_head=32, n_head_kv=4, n_ff=6144,
                           n_vocab=151936, head_dim=128)
MOE = ModelShape.stated(**QWEN3_CODER_30B_A3B, n_expert=128, n_expert_used=8, n_ff_expert=768, name="30B-A3B")
LOAD = LoadShape(n_ctx=8192, contexts=1)


def card(gb: int) -> SimpleNamespace:
    return SimpleNamespace(on_gpu=True, vram_free_bytes=int((gb - 0.4) * GIB), ram_total_bytes=64 * GIB,
                           ram_available_bytes=60 * GIB)


CPU_ONLY = SimpleNamespace(on_gpu=False, vram_free_bytes=0, ram_total_bytes=64 * GIB, ram_available_bytes=60 * GIB)


def test_the_experts_are_most_of_the_weights_and_a_token_reads_a_sixteenth_of_them():
    experts, layers = sum(MOE.expert_bytes), sum(MOE.layer_bytes)
    assert 0.95 < experts / layers < 0.98
    active = sum(MOE.active_layer_bytes)
    assert active == pytest.approx(layers - experts + experts / 16, rel=1e-6)
    assert active / layers < 0.1                          # ~3.3B of 30.5B parameters
    assert MOE.weight_bytes == pytest.approx(18.6 * GB, rel=1e-6)       # placed whole: every expert has a home


def test_its_speed_is_that_of_its_active_weights_and_its_memory_that_of_all_of_them():
    dense = ModelShape.stated(**QWEN3_CODER_30B_A3B)                   # the same file weighed as dense
    for device in (CPU_ONLY, card(12), card(24)):
        moe, flat = fit(MOE, device, LOAD), fit(dense, device, LOAD)
        assert moe.tokens_per_s > 4 * flat.tokens_per_s
        placed, placed_flat = moe.gpu_bytes + moe.ram_bytes, flat.gpu_bytes + flat.ram_bytes
        assert abs(placed - placed_flat) < 0.05 * placed_flat              # memory: every expert, alike
    on_cpu = fit(MOE, CPU_ONLY, LOAD)
    assert on_cpu.verdict == CPU and 20 < on_cpu.tokens_per_s < 40     # 60 GB/s over ~2 GB a token


def test_the_cards_it_fits_and_the_ones_it_is_split_on():
    assert fit(MOE, card(24), LOAD).verdict == FITS
    for gb in (8, 12, 16):
        split = fit(MOE, card(gb), LOAD)
        assert split.verdict == PARTIAL and 0 < split.layers_on_gpu < 48
        assert 0 < split.speed_vs_full < 1


def test_the_catalogue_entry_is_weighed_as_a_mixture_of_experts():
    entry = next(m for m in load_catalogue().models if m.id == "qwen3-coder-30b-a3b-instruct")
    shape = stated_shape(entry, entry.quants[0])
    assert shape.n_expert == 128 and shape.n_expert_used == 8
    assert sum(shape.active_layer_bytes) < 0.1 * sum(shape.layer_bytes)


def test_a_gguf_header_names_its_expert_tensors():
    meta = {"general.architecture": "qwen3moe", "qwen3moe.block_count": 2, "qwen3moe.embedding_length": 2048,
            "qwen3moe.attention.head_count": 32, "qwen3moe.attention.head_count_kv": 4,
            "qwen3moe.expert_count": 128, "qwen3moe.expert_used_count": 8}
    tensors = {"token_embd.weight": 100, "output.weight": 100, "output_norm.weight": 1}
    for layer in range(2):
        tensors |= {f"blk.{layer}.attn_q.weight": 10, f"blk.{layer}.ffn_gate_inp.weight": 2,
                    f"blk.{layer}.ffn_up_exps.weight": 640, f"blk.{layer}.ffn_gate_exps.weight": 640,
                    f"blk.{layer}.ffn_down_exps.weight": 640}
    shape = shape_of(meta, tensors)
    assert shape.expert_bytes == (1920, 1920) and shape.layer_bytes == (1932, 1932)
    assert shape.active_layer_bytes == (12 + 120, 12 + 120)
    dense = shape_of({**meta, "qwen3moe.expert_count": 0}, {"blk.0.ffn_up.weight": 5, "blk.1.ffn_up.weight": 5})
    assert dense.expert_bytes == () and dense.active_layer_bytes == dense.layer_bytes
