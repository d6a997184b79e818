"""New settings reach the scorer and the task focus through their own `use_settings`, never by assignment from
outside their class (on plain objects, plus a source scan of the engine)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from evoke_engine.kvcache.blocks import Block
from evoke_engine.memory.scorer import Scorer, TaskFocus
from evoke_engine.settings import Settings

pytestmark = pytest.mark.unit

ENGINE = Path(__file__).resolve().parents[2] / "evoke_engine"
FOCUS_SETTINGS = ("ema", "snap_cosine")


def test_use_settings_changes_the_floor_and_half_life_of_the_next_score(tmp_path):
    settings = Settings(home=str(tmp_path))
    scorer = Scorer(settings)
    user = Block(name="u", role="user", turn=1, tokens=[1] * 8, text="hi")
    doc = Block(name="d", role="file", turn=1, tokens=[1] * 8, text="x")
    assert scorer.score(user, query=None, focus=None, current_turn=30) == pytest.approx(settings.user_floor)
    before = scorer.recency(doc, current_turn=11)

    scorer.use_settings(settings.replace(user_floor=0.9, recency_half_life_turns=settings.recency_half_life_turns * 2))
    assert scorer.score(user, query=None, focus=None, current_turn=30) == pytest.approx(0.9)
    assert scorer.recency(doc, current_turn=11) == pytest.approx(before ** 0.5)


def test_focus_use_settings_changes_its_ema_and_snap_and_keeps_its_vector(tmp_path):
    focus = TaskFocus(ema=0.3, snap_cosine=0.3)
    focus.update(np.array([1.0, 0.0], dtype=np.float32))
    focus.use_settings(Settings(home=str(tmp_path), focus_ema=0.6, focus_snap_cosine=0.1))
    assert (focus.ema, focus.snap_cosine) == (0.6, 0.1)
    assert focus.vector is not None and focus.vector.tolist() == [1.0, 0.0]


def _settings_poked(tree: ast.AST) -> list[int]:
    """Lines that assign an attribute of a `.scorer`, or a focus's settings (`.focus.ema`, `.focus.snap_cosine`)."""
    lines = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
        for target in targets:
            for name in target.elts if isinstance(target, ast.Tuple) else [target]:
                owner = name.value if isinstance(name, ast.Attribute) else None
                if isinstance(owner, ast.Attribute) and (owner.attr == "scorer" or
                                                         (owner.attr == "focus" and name.attr in FOCUS_SETTINGS)):
                    lines.append(name.lineno)
    return lines


def test_no_module_assigns_the_scorers_or_the_focus_settings_from_outside():
    poked = [f"{path.relative_to(ENGINE)}:{line}" for path in sorted(ENGINE.rglob("*.py")) if path.name != "scorer.py"
             for line in _settings_poked(ast.parse(path.read_text()))]
    assert poked == []
    old = "self.settings = self.scorer.s = new\nself.focus.ema, self.focus.snap_cosine = new.focus_ema, 0.3\n"
    assert _settings_poked(ast.parse(old)) == [1, 2, 2]         # what memory.py did before `use_settings`
