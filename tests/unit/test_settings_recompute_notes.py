"""The settings dialog says what a change recomputes in saved conversations (plain logic, no Qt)."""

from __future__ import annotations

import pytest

from app.settings_form import field_specs, recompute_notes
from evoke_engine import Settings

pytestmark = pytest.mark.unit      # the unit tier: no model loaded (make test-fast)


def test_changes_that_invalidate_saved_state_are_named():
    old, specs = Settings(), field_specs(Settings)
    assert recompute_notes(old, old.replace(), specs) == []
    assert recompute_notes(old, old.replace(temperature=0.1, budget_tokens=4096), specs) == []
    notes = recompute_notes(old, {"embedder": "/models/bge", "kv_cache_type": "q8_0", "block_tokens": 64}, specs)
    assert len(notes) == 3
    assert any(n.startswith("Embedder model:") and "K/V is kept" in n for n in notes)
    assert any(n.startswith("KV cache type:") and "re-reads its history" in n for n in notes)
    assert any(n.startswith("Block size:") and "nothing is recomputed" in n for n in notes)
