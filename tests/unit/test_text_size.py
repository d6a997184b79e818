"""The chat's text size on plain values (app/text_size.py): the steps within the setting's declared bounds, the base
sizes read from the style sheet, and the window's sheet that scales them (sizes only, nothing at 100 %)."""

from __future__ import annotations

import pytest

from app.resources import stylesheet
from app.settings_form import field_specs
from app.text_size import RUNGS, TEXT_NAMES, base_points, step, text_size_sheet
from app.theme import sheet_colours
from evoke_engine.settings import Settings

pytestmark = pytest.mark.unit

SPEC = next(s for s in field_specs(Settings) if s.name == "text_size")
LOW, HIGH, DEFAULT = int(SPEC.low), int(SPEC.high), int(SPEC.default)


def test_the_setting_is_declared_in_the_window_group_with_bounds_around_the_default():
    assert SPEC.group == "Window" and SPEC.applies == "now" and SPEC.kind == "int"
    assert (LOW, DEFAULT, HIGH) == (50, 100, 300) and SPEC.label == "Text size" and SPEC.format(125) == "125 %"
    assert SPEC.check(49) and SPEC.check(301) and SPEC.check(100) is None


def test_steps_walk_the_rungs_and_stop_at_the_bounds():
    up, value = [], DEFAULT
    while (value := step(value, 1, LOW, HIGH)) not in up:
        up.append(value)
    assert up == [110, 125, 150, 175, 200, 250, 300]
    down, value = [], DEFAULT
    while (value := step(value, -1, LOW, HIGH)) not in down:
        down.append(value)
    assert down == [90, 80, 70, 60, 50]
    assert step(HIGH, 1, LOW, HIGH) == HIGH and step(LOW, -1, LOW, HIGH) == LOW


def test_a_value_between_rungs_steps_to_the_nearest_rung_on_that_side_and_bounds_cut_the_rungs():
    assert step(113, 1, LOW, HIGH) == 125 and step(113, -1, LOW, HIGH) == 110
    assert step(100, 1, 80, 120) == 110 and step(110, 1, 80, 120) == 120 and step(120, 1, 80, 120) == 120
    assert step(85, -1, 80, 120) == 80                     # a bound off the rungs is a step of its own
    assert all(LOW <= step(v, d, LOW, HIGH) <= HIGH for v in range(LOW, HIGH + 1) for d in (1, -1))
    assert all(step(v, 1, LOW, HIGH) > v for v in range(LOW, HIGH))
    assert all(step(v, -1, LOW, HIGH) < v for v in range(LOW + 1, HIGH + 1))
    assert set(RUNGS) >= {LOW, DEFAULT, HIGH}


def test_base_sizes_come_from_each_widgets_own_rule_else_the_sheets_general_size():
    sheet = ("/* #bubbleBody { font-size: 99pt; } */\nQWidget { color: #e6edf3; font-size: 10pt; }\n"
             "#bubbleBody, QListView#eventList { background: transparent; font-size: 10.5pt; }\n"
             "#prompt:focus { font-size: 30pt; }\n#errorBanner #prompt { font-size: 40pt; }")
    assert base_points(sheet, ("bubbleBody", "eventList", "prompt")) == {
        "bubbleBody": 10.5, "eventList": 10.5, "prompt": 10.0}      # a state or a descendant rule is not its base
    real = base_points(stylesheet())
    assert set(real) == set(TEXT_NAMES) and real["bubbleBody"] == real["prompt"] == 10.5
    assert real["codeText"] == real["conversationList"] == 10.0 and real["bubbleTime"] == 8.5


def test_the_window_sheet_scales_every_named_size_and_holds_no_colour():
    bases = base_points(stylesheet())
    assert text_size_sheet(bases, 100) == ""
    sheet = text_size_sheet(bases, 125)
    rules = dict(line.split(" { font-size: ") for line in sheet.splitlines())
    assert rules["#bubbleBody"] == "13.12pt; }" and rules["#prompt"] == "13.12pt; }"
    assert rules["#codeText"] == "12.5pt; }" and len(rules) == len(TEXT_NAMES)
    assert not sheet_colours(text_size_sheet(bases, 50) + text_size_sheet(bases, 300))
