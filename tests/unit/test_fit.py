"""Issue 60, fit before the download: the layers `auto` offloads and the verdict for stated cards (8, 12, 16, 24 GB,
CPU only) and Qwen2.5-Coder-like 7B / 14B / 32B Q4_K_M shapes, the arithmetic behind them, and the shape read from a
GGUF's header. No model is loaded and no GPU is needed.

The cards: total memory less 0.4 GiB a desktop holds, 1 GiB of that kept free (llama.cpp's fit margin). The shapes:
Qwen2.5-Coder Instruct's hyperparameters and its Q4_K_M files' sizes (4.68, 8.99, 19.85 GB)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from evoke_engine.runtime import fit as fitting
from evoke_engine.runtime.fit import CPU, FITS, GIB, PARTIAL, TOO_BIG, LoadShape, choose_gpu_layers, fit
from evoke_engine.runtime.gguf_shape import ModelShape, read_shape
from evoke_engine.runtime.model_file import default_model_path
from evoke_engine.settings import GPU_LAYERS_ALL, GPU_LAYERS_AUTO, Settings

pytestmark = pytest.mark.unit

GB = 10**9
MIB = 1 << 20
QWEN_VOCAB = 152064
CODER_7B = ModelShape.stated(file_bytes=int(4.68 * GB), n_layer=28, n_embd=3584, n_head=28, n_head_kv=4,
                             n_ff=18944, n_vocab=QWEN_VOCAB, n_ctx_train=32768, name="7B")
CODER_14B = ModelShape.stated(file_bytes=int(8.99 * GB), n_layer=48, n_embd=5120, n_head=40, n_head_kv=8,
                              n_ff=13824, n_vocab=QWEN_VOCAB, n_ctx_train=32768, name="14B")
CODER_32B = ModelShape.stated(file_bytes=int(19.85 * GB), n_layer=64, n_embd=5120, n_head=40, n_head_kv=8,
                              n_ff=27648, n_vocab=QWEN_VOCAB, n_ctx_train=32768, name="32B")
ONE_CONTEXT_8K = LoadShape(n_ctx=8192, contexts=1)
DEFAULT_LOAD = LoadShape.of(Settings(), on_gpu=True)          # 16K cells in 4 streams, the prefixes 4K more


def card(gb: int, ram_gib: int = 32) -> SimpleNamespace:
    return SimpleNamespace(on_gpu=True, vram_total_bytes=gb * GIB, vram_free_bytes=int((gb - 0.4) * GIB),
                           ram_total_bytes=ram_gib * GIB, ram_available_bytes=(ram_gib - 4) * GIB)


def cpu_only(ram_gib: int = 32) -> SimpleNamespace:
    return SimpleNamespace(on_gpu=False, vram_total_bytes=0, vram_free_bytes=0,
                           ram_total_bytes=ram_gib * GIB, ram_available_bytes=(ram_gib - 4) * GIB)


# -- the arithmetic --------------------------------------------------------------------------------------------
def test_stated_shape_splits_the_file_without_loss():
    for shape in (CODER_7B, CODER_14B, CODER_32B):
        assert sum(shape.layer_bytes) + shape.output_bytes + shape.input_bytes == pytest.approx(
            {"7B": 4.68, "14B": 8.99, "32B": 19.85}[shape.name] * GB, abs=1)
    # a 7B layer of Q4_K_M: ~233M parameters at ~4.9 bits
    assert 130 * MIB < CODER_7B.layer_bytes[0] < 145 * MIB


def test_kv_bytes_match_the_runtimes_formula():
    """Runtime.kv_bytes_per_token: 2 (K, V) x n_layer x head_dim x n_head_kv x bytes per value."""
    assert CODER_7B.kv_bytes_per_token_per_layer("f16") * 28 == 2 * 28 * 128 * 4 * 2          # 56 KiB a token
    assert CODER_32B.kv_bytes_per_token_per_layer("f16") * 64 == 2 * 64 * 128 * 8 * 2         # 256 KiB a token
    assert CODER_32B.kv_bytes_per_token_per_layer("q8_0") == pytest.approx(
        CODER_32B.kv_bytes_per_token_per_layer("f16") * 17 / 32)


def test_compute_buffer_matches_llama_cpps_report_for_the_embedded_model():
    """llama.cpp's own report for SmolLM2-135M on the CPU, one context, n_batch 512: 98.27 MiB at 8K with flash
    attention (the logits of 512 tokens dominate), 168.33 MiB at 8K and 99.39 MiB at 2K without."""
    shape = read_shape(default_model_path())
    for n_ctx, flash, reported in ((8192, True, 98.27), (8192, False, 168.33), (2048, False, 99.39)):
        load = LoadShape(n_ctx=n_ctx, contexts=1, flash_attention=flash)
        estimate = fitting.compute_bytes(shape, load, layers=True, output=True) / MIB
        assert estimate == pytest.approx(reported, rel=0.05), (n_ctx, flash)


def test_layers_on_gpu_counts_the_output_layer_first():
    """llama-model.cpp offloads slots n_layer + 1 - n_gpu_layers .. n_layer; slot n_layer is the output layer."""
    assert [fitting.layers_on_gpu(28, n) for n in (0, 1, 2, 28, 29, 999)] == [0, 0, 1, 27, 28, 28]


# -- the cards -------------------------------------------------------------------------------------------------
def test_7b_fits_every_card_at_8k_and_at_the_default_load():
    """7B: 4.0 GiB of GPU weights + 0.4 GiB KV at 8K + 0.3 GiB compute = 4.8 GiB, under an 8 GB card's 6.6 GiB; the
    default load (16K, four contexts each reserving 0.3 GiB of logits) needs 6.2 GiB, still under."""
    for gb in (8, 12, 16, 24):
        for load in (ONE_CONTEXT_8K, DEFAULT_LOAD):
            result = fit(CODER_7B, card(gb), load)
            assert result.verdict == FITS, (gb, load)
            assert result.n_gpu_layers == 29 and result.layers_on_gpu == 28
            assert result.speed_vs_full == 1.0 and result.label() == "fits on the GPU"
    assert fit(CODER_7B, card(8), ONE_CONTEXT_8K).gpu_bytes / GIB == pytest.approx(4.8, abs=0.1)


def test_7b_at_32k_spills_a_few_layers_on_8_gb():
    """32K cells of f16 KV are 1.75 GiB: 4.0 + 1.75 + 1.3 (four contexts' compute) is over 6.6 GiB."""
    result = fit(CODER_7B, card(8), LoadShape(n_ctx=32768, contexts=4))
    assert result.verdict == PARTIAL and 20 <= result.layers_on_gpu < 28
    assert fit(CODER_7B, card(8), LoadShape(n_ctx=32768, contexts=4, kv_cache_type="q8_0")).verdict == FITS


def test_14b_is_partial_on_8_gb_and_fits_from_12_gb_at_8k():
    """14B: 7.9 GiB of layer weights + 0.45 output + 1.5 GiB KV at 8K: over 8 GB's 6.6 GiB, under 12 GB's 10.6."""
    on_8 = fit(CODER_14B, card(8), ONE_CONTEXT_8K)
    assert on_8.verdict == PARTIAL and 25 <= on_8.layers_on_gpu <= 35
    assert 0.2 < on_8.speed_vs_full < 0.5
    for gb in (12, 16, 24):
        assert fit(CODER_14B, card(gb), ONE_CONTEXT_8K).verdict == FITS
    # the default load (16K, 3 GiB KV, four compute buffers) is partial on 12 GB, fits on 16
    assert fit(CODER_14B, card(12), DEFAULT_LOAD).verdict == PARTIAL
    assert fit(CODER_14B, card(16), DEFAULT_LOAD).verdict == FITS


def test_32b_is_partial_on_16_gb_and_fits_24_gb_only_at_small_context():
    """32B: 17.6 GiB of layer weights alone exceed 16 GB's 14.6 GiB budget; on 24 GB (22.6 GiB budget) 8K cells
    (2 GiB) fit, the default 16K in four contexts (4 GiB + 1.3 GiB compute) does not, nor does 32K."""
    on_16 = fit(CODER_32B, card(16), ONE_CONTEXT_8K)
    assert on_16.verdict == PARTIAL and 40 <= on_16.layers_on_gpu <= 50
    assert on_16.gpu_bytes <= on_16.gpu_budget_bytes and on_16.full_offload_ctx == 0
    assert on_16.label().startswith(f"partly offloaded ({on_16.layers_on_gpu} of 64 layers, ~")
    assert fit(CODER_32B, card(24), ONE_CONTEXT_8K).verdict == FITS
    at_default = fit(CODER_32B, card(24), DEFAULT_LOAD)
    assert at_default.verdict == PARTIAL and at_default.layers_on_gpu >= 55
    assert 8192 < at_default.full_offload_ctx < 16384               # what a smaller context would allow
    assert fit(CODER_32B, card(24), replace(DEFAULT_LOAD, n_ctx=at_default.full_offload_ctx)).verdict == FITS
    assert fit(CODER_32B, card(24), replace(DEFAULT_LOAD, n_ctx=at_default.full_offload_ctx + 256)).verdict == PARTIAL
    assert fit(CODER_32B, card(24), LoadShape(n_ctx=32768, contexts=1)).verdict == PARTIAL


def test_fewer_layers_with_less_memory_and_more_context():
    for shape in (CODER_14B, CODER_32B):
        layers = [fit(shape, card(gb), DEFAULT_LOAD).n_gpu_layers for gb in (8, 12, 16, 24)]
        assert layers == sorted(layers)
        by_ctx = [fit(shape, card(12), LoadShape(n_ctx=n, contexts=4)).n_gpu_layers for n in (4096, 16384, 65536)]
        assert by_ctx == sorted(by_ctx, reverse=True)


def test_each_chosen_count_is_the_most_that_fits():
    for shape in (CODER_7B, CODER_14B, CODER_32B):
        for gb in (8, 12, 16, 24):
            result = fit(shape, card(gb), DEFAULT_LOAD)
            assert result.gpu_bytes <= result.gpu_budget_bytes
            if result.verdict != FITS:                    # one layer more would cross the budget
                one_more = fit(shape, SimpleNamespace(**{**vars(card(gb)), "vram_free_bytes": card(gb).vram_free_bytes
                                                         + 2 * shape.layer_bytes[0]}), DEFAULT_LOAD)
                assert one_more.n_gpu_layers > result.n_gpu_layers


def test_cpu_only_runs_what_the_ram_holds_and_says_too_big_otherwise():
    """No GPU: every weight, the KV and the compute in RAM (28 GiB available less 1 GiB)."""
    for shape in (CODER_7B, CODER_14B, CODER_32B):
        result = fit(shape, cpu_only(), ONE_CONTEXT_8K)
        assert result.verdict == CPU and result.n_gpu_layers == 0 and result.gpu_bytes == 0
        assert result.label().startswith("runs on the CPU (~")
    speeds = [fit(s, cpu_only(), ONE_CONTEXT_8K).tokens_per_s for s in (CODER_7B, CODER_14B, CODER_32B)]
    assert speeds == sorted(speeds, reverse=True) and 10 < speeds[0] < 20     # 60 GB/s over 4.4 GB a token
    assert fit(CODER_32B, cpu_only(16), ONE_CONTEXT_8K).verdict == TOO_BIG
    assert fit(CODER_32B, cpu_only(16), ONE_CONTEXT_8K).label().startswith("too big: needs 20.")
    # partly offloaded and the rest over the RAM: too big as well
    assert fit(CODER_32B, card(8, ram_gib=16), ONE_CONTEXT_8K).verdict == TOO_BIG


def test_partial_speed_follows_the_bandwidths():
    slow_ram = fit(CODER_32B, card(16), ONE_CONTEXT_8K, ram_bandwidth=30e9)
    fast_ram = fit(CODER_32B, card(16), ONE_CONTEXT_8K, ram_bandwidth=90e9)
    assert slow_ram.n_gpu_layers == fast_ram.n_gpu_layers
    assert slow_ram.speed_vs_full < fast_ram.speed_vs_full < 1.0


# -- the setting and the choice at load ------------------------------------------------------------------------
def test_auto_is_the_default_and_a_saved_minus_one_means_auto(tmp_path):
    """-1 was 'all' and every saved file holds it (save writes each setting): it now means auto, which offloads
    all when they fit; -2 says all regardless, as llama.cpp's -ngl does."""
    assert Settings().n_gpu_layers == GPU_LAYERS_AUTO == -1
    path = tmp_path / "settings.json"
    path.write_text('{"n_gpu_layers": -1}')
    assert Settings.load_checked(path)[0].n_gpu_layers == GPU_LAYERS_AUTO
    path.write_text('{"n_gpu_layers": -2}')
    settings, problems = Settings.load_checked(path)
    assert settings.n_gpu_layers == GPU_LAYERS_ALL and not problems
    path.write_text('{"n_gpu_layers": -3}')
    settings, problems = Settings.load_checked(path)
    assert settings.n_gpu_layers == GPU_LAYERS_AUTO and problems[0].names == ("n_gpu_layers",)


def test_choice_at_load_cpu_number_all_and_auto():
    model = default_model_path()
    assert choose_gpu_layers(Settings(), cpu_only(), model).n_gpu_layers == 0
    assert choose_gpu_layers(Settings(n_gpu_layers=12), card(8), model).n_gpu_layers == 12
    assert "set in Settings" in choose_gpu_layers(Settings(n_gpu_layers=12), card(8), model).reason
    assert choose_gpu_layers(Settings(n_gpu_layers=GPU_LAYERS_ALL), card(8), model).n_gpu_layers == 999
    auto = choose_gpu_layers(Settings(), card(8), model)
    assert auto.n_gpu_layers == 31 and auto.fit is not None and auto.fit.verdict == FITS
    assert auto.reason.startswith("auto: all 30 layers on the GPU (")
    # with remote devices every layer is offloaded and split among them by free memory, as before auto
    remote = choose_gpu_layers(Settings(rpc_servers="10.0.0.2:50052"), card(8), model)
    assert remote.n_gpu_layers == 999 and "remote devices" in remote.reason
    # a card with no room for even the output layer: the CPU, and the reason says so
    tiny = SimpleNamespace(**{**vars(card(8)), "vram_free_bytes": GIB})
    nothing = choose_gpu_layers(Settings(), tiny, model)
    assert nothing.n_gpu_layers == 0 and "running on the CPU" in nothing.reason


def test_auto_partial_reason_names_layers_speed_and_context():
    result = fit(CODER_32B, card(24), DEFAULT_LOAD)
    reason = fitting.auto_reason(result)
    assert reason.startswith(f"auto: {result.layers_on_gpu} of 64 layers on the GPU, the rest on the CPU: 23.6 GiB")
    assert f"all layers fit up to n_ctx {result.full_offload_ctx}" in reason


def test_runtime_asks_the_fit_for_auto():
    from evoke_engine.runtime.runtime import Runtime
    assert Runtime.gpu_layers_requested(Settings(), card(8)) == 31                  # SmolLM2: 30 layers + output
    assert Runtime.gpu_layers_requested(Settings(), cpu_only()) == 0
    assert Runtime.gpu_layers_requested(Settings(n_gpu_layers=5), card(8)) == 5


def test_host_memory_reads_meminfo(tmp_path: Path):
    from evoke_engine.runtime.device import host_memory
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32768000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n")
    assert host_memory(meminfo) == (20000000 * 1024, 32768000 * 1024)
    available, total = host_memory()
    assert 0 < available <= total
