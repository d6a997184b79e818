"""Issue 60, the model dialog's fit marks: every catalogue quant judged before its download from a shape stated by
its layer count, parameters and size; files on disk from their header; on-disk quants marked. No model loaded."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evoke_engine.models import load_catalogue
from evoke_engine.models.fit_marks import (
    KNOWN_HYPER,
    catalogue_marks,
    estimated_hyper,
    file_fit,
    local_marks,
    machine_marks,
    stated_shape,
)
from evoke_engine.runtime.fit import CPU, FITS, GIB, PARTIAL, TOO_BIG, LoadShape
from evoke_engine.settings import Settings

pytestmark = pytest.mark.unit


def card(gb: float, ram_gib: int = 32) -> SimpleNamespace:
    return SimpleNamespace(on_gpu=True, vram_total_bytes=int(gb * GIB), vram_free_bytes=int((gb - 0.4) * GIB),
                           ram_total_bytes=ram_gib * GIB, ram_available_bytes=(ram_gib - 4) * GIB,
                           label=lambda: "CUDA0 (a card)")


def test_every_catalogue_entry_has_stated_sizes_and_each_quant_a_shape_adding_up_to_its_file():
    catalogue = load_catalogue()
    assert {m.id for m in catalogue.models} <= set(KNOWN_HYPER)
    for model in catalogue.models:
        for quant in model.quants:
            shape = stated_shape(model, quant)
            assert shape is not None and shape.n_layer == model.n_layer
            assert sum(shape.layer_bytes) + shape.input_bytes + shape.output_bytes == pytest.approx(
                quant.size_bytes + (shape.output_bytes if KNOWN_HYPER[model.id].tied else 0), abs=model.n_layer + 2)


def test_the_kv_of_stated_shapes_is_the_models_own():
    by_id = load_catalogue().by_id
    seven = by_id("qwen2.5-coder-7b-instruct")
    assert stated_shape(seven, seven.quants[0]).kv_bytes_per_token_per_layer("f16") == 2 * 128 * 4 * 2
    moe = by_id("qwen3-coder-30b-a3b-instruct")
    assert stated_shape(moe, moe.quants[0]).kv_bytes_per_token_per_layer("f16") == 2 * 128 * 4 * 2


def test_an_entry_without_stated_sizes_is_estimated_towards_a_larger_kv():
    guess = estimated_hyper(7.6, 28)                  # Qwen2.5-7B: 3584 wide, 4 KV heads of 128
    assert 3072 <= guess.n_embd <= 4608 and guess.n_embd % 128 == 0
    assert guess.n_head_kv * (guess.n_embd // guess.n_head) >= 4 * 128
    assert estimated_hyper(0.5, 24).n_head_kv <= estimated_hyper(0.5, 24).n_head


def test_marks_follow_the_card_and_on_disk_quants_are_marked(tmp_path):
    catalogue = load_catalogue()
    seven = catalogue.by_id("qwen2.5-coder-7b-instruct")
    on_disk = tmp_path / seven.repo / seven.quant("Q4_K_M").file
    on_disk.parent.mkdir(parents=True)
    on_disk.write_bytes(b"GGUF")                    # a name the catalogue knows; its header is not a model's
    load = LoadShape(n_ctx=8192)

    def verdict(device, model_id, quant):
        marks = catalogue_marks(catalogue, tmp_path, device, load)
        return next(m for m in marks if m.model.id == model_id and m.quant.name == quant)

    assert verdict(card(24), "qwen2.5-coder-7b-instruct", "Q4_K_M").fit.verdict == FITS
    assert verdict(card(8), "qwen2.5-coder-32b-instruct", "Q4_K_M").fit.verdict == PARTIAL
    assert verdict(card(8, ram_gib=8), "qwen2.5-coder-32b-instruct", "Q8_0").fit.verdict == TOO_BIG
    cpu = SimpleNamespace(on_gpu=False, vram_free_bytes=0, ram_total_bytes=32 * GIB, ram_available_bytes=28 * GIB)
    assert verdict(cpu, "qwen2.5-coder-1.5b-instruct", "Q8_0").fit.verdict == CPU
    marks = catalogue_marks(catalogue, tmp_path, card(12), load)
    assert [(m.model.id, m.quant.name) for m in marks if m.on_disk] == [(seven.id, "Q4_K_M")]
    assert next(m for m in marks if m.on_disk).spec == f"{seven.repo}:{seven.quant('Q4_K_M').file}"
    local = local_marks(tmp_path, catalogue, card(12), load)
    assert len(local) == 1 and local[0].fit is None and local[0].fit_label.startswith("fit unknown:")


def test_a_file_on_disk_is_judged_from_its_header_and_the_machine_is_described(tmp_path):
    from evoke_engine.runtime.model_file import default_model_path

    result, label = file_fit(default_model_path(), card(8), LoadShape(n_ctx=4096))
    assert result is not None and result.verdict == FITS and label == "fits on the GPU"
    marks = machine_marks(Settings(home=str(tmp_path), n_ctx=4096), load_catalogue(), card(12))
    assert marks.device_label.startswith("CUDA0 (a card): 11.6 GiB of 12.0 GiB free; RAM 28.0 GiB free")
    assert "context of 4096 tokens" in marks.device_label and marks.folder == tmp_path / "data" / "models"
    assert len(marks.catalogue) == sum(len(m.quants) for m in load_catalogue().models) and marks.on_disk == []
