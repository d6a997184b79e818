"""Loading settings.json (issue 41, item 4): a bad value keeps its default and every other saved value stays; wrong
types are refused (4096.7 or true for an integer), each problem naming the field, the file and why."""

from __future__ import annotations

import dataclasses
import json

import pytest

from evoke_engine.settings import Settings, field_model

pytestmark = pytest.mark.unit

SAVED = {"budget_tokens": 4096.7, "max_tokens": True, "temperature": 0.2, "top_k": 12, "recovery": "discard",
         "theme": "dark", "block_tokens": 64, "system_prompt": "Be terse.", "ttl_long_s": 7200,
         "ram_budget_bytes": 1 << 28, "server_port": 9001, "tools_enabled": False}


def _write(tmp_path, values) -> object:
    path = tmp_path / "config" / "settings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(values))
    return path


def test_one_bad_field_and_one_wrong_type_keep_every_other_saved_setting_and_name_the_field(tmp_path):
    path = _write(tmp_path, {**SAVED, "recovery_top_k": 500})          # out of range, besides the two types
    settings, problems = Settings.load_checked(home=str(tmp_path))
    bad = {"budget_tokens", "max_tokens", "recovery_top_k"}
    for name in bad:
        assert getattr(settings, name) == getattr(Settings, name), name      # its default
    for name, value in SAVED.items():
        if name not in bad:
            assert getattr(settings, name) == value, name                   # every other value kept
    by_name = {problem.names: problem for problem in problems}
    assert set(by_name) == {("budget_tokens",), ("max_tokens",), ("recovery_top_k",)}
    assert "not a whole number" in by_name[("budget_tokens",)].reason
    assert "4096.7" in by_name[("budget_tokens",)].text and "not a whole number" in by_name[("max_tokens",)].text
    assert "true" in by_name[("max_tokens",)].text and "[0, 64]" in by_name[("recovery_top_k",)].text
    assert all(str(path) in problem.text and "using the default" in problem.text for problem in problems)


def test_load_logs_each_problem_with_the_field_and_the_file(tmp_path, caplog):
    path = _write(tmp_path, {"n_threads": 2.5, "top_p": 0.5})
    with caplog.at_level("WARNING"):
        settings = Settings.load(home=str(tmp_path))
    assert settings.top_p == 0.5 and settings.n_threads == Settings.n_threads
    assert any("n_threads" in r.message and str(path) in r.message for r in caplog.records)


def test_a_pair_that_fails_a_cross_check_keeps_both_defaults_and_the_rest(tmp_path):
    _write(tmp_path, {"low_watermark": 0.95, "high_watermark": 0.9, "top_k": 7})
    settings, problems = Settings.load_checked(home=str(tmp_path))
    assert (settings.low_watermark, settings.high_watermark, settings.top_k) == (0.7, 0.92, 7)
    assert problems[0].names == ("low_watermark", "high_watermark") and "below" in problems[0].reason


@pytest.mark.parametrize("text, fragment", [("{not json", "could not be read"), ("[1, 2]", "JSON list")])
def test_an_unreadable_file_says_so_and_uses_defaults(tmp_path, text, fragment):
    path = tmp_path / "config" / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    settings, problems = Settings.load_checked(home=str(tmp_path))
    assert settings.budget_tokens == Settings.budget_tokens
    assert len(problems) == 1 and fragment in problems[0].text and str(path) in problems[0].text


@pytest.mark.parametrize("change", [{"budget_tokens": 4096.7}, {"max_tokens": True}, {"temperature": "hot"},
                                    {"tools_enabled": 1}, {"pool_bits": "8"}])
def test_wrong_types_are_refused_in_code_too_naming_the_field(change):
    name = next(iter(change))
    with pytest.raises(ValueError, match=name):
        Settings(**change)


def test_the_validation_model_is_derived_from_the_declarations():
    """One declaration per setting: the pydantic model has exactly the dataclass fields, defaults and bounds."""
    model = field_model()
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    assert set(model.model_fields) == set(fields)
    for name, info in model.model_fields.items():
        assert info.default == fields[name].default, name
        bounds = {type(m).__name__: m for m in info.metadata}
        if fields[name].metadata["low"] is not None:
            assert bounds["Ge"].ge == fields[name].metadata["low"] and bounds["Le"].le == fields[name].metadata["high"]


def test_settings_saved_by_the_app_load_back_without_problems(tmp_path):
    Settings(home=str(tmp_path), budget_tokens=999, temperature=0.0, model_path=None).save()
    settings, problems = Settings.load_checked(home=str(tmp_path))
    assert problems == [] and settings.budget_tokens == 999
