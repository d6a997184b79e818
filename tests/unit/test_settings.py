"""Settings: every default validates, bad values are refused with the reason, files round-trip."""

from __future__ import annotations

import dataclasses
import json

import pytest

from evoke_engine.settings import Settings

pytestmark = pytest.mark.unit      # the unit tier: no model loaded (make test-fast)


def test_every_default_is_valid_and_described(tmp_path):
    settings = Settings(home=str(tmp_path))
    for row in Settings.describe():
        assert row["description"] and row["group"] and row["applies"] in ("now", "reload")
        default = row["default"]                   # checked against its own declaration, not by validate()
        if row["choices"]:
            assert default in row["choices"], row["name"]
        if row["low"] is not None and default is not None:
            assert row["low"] <= default <= row["high"], row["name"]
        kinds = {"int": int, "float": (int, float), "str": str, "bool": bool}
        declared = str(row["type"]).split(" | ")[0]
        assert default is None or isinstance(default, kinds[declared]), row["name"]
        assert getattr(settings, row["name"]) == default


@pytest.mark.parametrize("change, fragment", [
    ({"budget_tokens": 10}, "budget_tokens"), ({"recovery": "magic"}, "choose one of"),
    ({"low_watermark": 0.95}, "below"), ({"kv_cache_type": "q4_0"}, "kv_cache_type")])
def test_bad_values_are_refused(tmp_path, change, fragment):
    with pytest.raises(ValueError, match=fragment):
        Settings(home=str(tmp_path), **change)


def test_save_and_load_round_trip(tmp_path):
    settings = Settings(home=str(tmp_path), budget_tokens=999, recovery="discard")
    path = settings.save()
    loaded = Settings.load(home=str(tmp_path))
    assert path.exists() and loaded.budget_tokens == 999 and loaded.recovery == "discard"


def test_unknown_and_invalid_files_fall_back(tmp_path):
    path = tmp_path / "config" / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"budget_tokens": 700, "no_such_setting": 1}))
    assert Settings.load(home=str(tmp_path)).budget_tokens == 700
    path.write_text("{not json")
    assert Settings.load(home=str(tmp_path)).budget_tokens == Settings.budget_tokens
    path.write_text(json.dumps({"budget_tokens": -5}))
    assert Settings.load(home=str(tmp_path)).budget_tokens == Settings.budget_tokens


def test_reload_needed_only_for_model_settings(tmp_path):
    a = Settings(home=str(tmp_path))
    b = dataclasses.replace(a, budget_tokens=300, n_ctx=1024)
    assert b.needs_reload(a) == ["n_ctx"]


def test_the_settings_a_kv_file_is_made_for_are_declared_once():
    import inspect

    from app.settings_form import SAVED_STATE_EFFECTS
    from evoke_engine.settings import KV_FILE_SETTINGS
    from evoke_engine.store.kvfiles import model_hash

    assert tuple(inspect.signature(model_hash).parameters) == KV_FILE_SETTINGS
    assert all("re-reads its history" in SAVED_STATE_EFFECTS[name] for name in KV_FILE_SETTINGS)
    assert set(KV_FILE_SETTINGS) <= {f.name for f in dataclasses.fields(Settings)}


def test_pool_bits_is_a_choice_of_16_8_4_in_the_panel_and_its_text_maps_back_to_the_number():
    from app import settings_form as form

    spec = next(s for s in form.field_specs(Settings) if s.name == "pool_bits")
    assert spec.kind == "choice" and spec.choices == (16, 8, 4)
    assert form.from_editor(spec, "4") == 4 and form.to_editor(spec, 8) == 8
    assert spec.check(8) is None and "choose one of 16, 8, 4" in spec.check(12)
    assert Settings(pool_bits=4).pool_bits == 4
    with pytest.raises(ValueError, match="pool_bits"):
        Settings(pool_bits=2)
