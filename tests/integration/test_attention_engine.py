"""The attention signal inside the Engine on the real embedded model: turns with eviction and recovery
keep the capture's K store equal to llama.cpp's K, and blocks carry an attention share."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.attention_build import ensure_library

from evoke_engine import Engine, Settings
from evoke_engine.kvcache.blocks import BlockState
from evoke_engine.runtime import reanchor


def _document(tag: str, lines: int) -> str:
    return "\n".join(f"{tag} line {i}: the valve on floor {i} is checked every {i + 2} days." for i in range(lines))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    ensure_library()
    settings = Settings(home=str(tmp_path_factory.mktemp("attn-engine")), budget_tokens=384, n_ctx=4096, slots=2,
                        embedder="off", attention_capture=True, weight_attention=2.0)
    with Engine(settings) as eng:
        yield eng


def test_capture_follows_the_engine_through_eviction_and_recovery(engine):
    assert engine.diagnostics().attention is not None and engine.diagnostics().attention.active
    conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
    conv.send("Read this.", attachments=[("a.txt", _document("A", 10))], max_tokens=6, temperature=0)
    conv.send("And this.", attachments=[("b.txt", _document("B", 10))], max_tokens=6, temperature=0)
    conv.send("What does a.txt say about floor 3?", max_tokens=8, temperature=0)   # named: a.txt comes back
    conv.check()
    stats = conv.stats()
    assert stats.evictions > 0 and stats.recoveries > 0
    # the model as judge of the turn's recoveries: what the message attended to is on each decision, for the record
    last_turn = [d for d in stats.recovery_decisions if d["turn"] == stats.turn]
    assert last_turn and all(d["message_attention"] is not None and 0.0 <= d["message_attention"] <= 1.0
                             for d in last_turn)
    assert max(d["message_attention_per_token"] for d in last_turn) == 1.0

    def compare() -> tuple[int, int]:
        memory = engine.lifecycle.get(conv.id).memory
        capture, kv = engine.diagnostics().attention, engine.diagnostics().kv
        kv.flush_pending_shifts()
        blob = bytes(kv._state_of(memory.seq))
        layout = reanchor.parse(blob, capture.geometry)
        positions = np.ndarray((layout.n_cells,), dtype="<i4", buffer=blob, offset=layout.positions_offset,
                               strides=(layout.cell_stride,))
        layer = capture.layers[0]
        width = capture.geometry.n_head_kv * capture.geometry.head_dim
        theirs = np.frombuffer(blob, dtype=np.float16, count=layout.n_cells * width,
                               offset=layout.k_offsets[layer]).reshape(layout.n_cells, width).astype(np.float32)
        present, rows = capture.k_rows(memory.seq, layer)
        held = kv.ahead_tokens(memory.seq)                 # the next message's opening, decoded ahead
        assert present.sum() == layout.n_cells == memory.active_tokens + held
        ours = rows[positions].astype(np.float32)
        ulp = np.spacing(np.abs(theirs).astype(np.float16)).astype(np.float32)
        bad = int((np.abs(ours - theirs) > 2 * ulp).sum())
        scored = sum(1 for b in memory.table.resident if memory.attention.value(b) is not None)
        known = sum(1 for b in memory.table.blocks if b.state is not BlockState.RESIDENT
                    and b.name in memory.attention.last_known)
        return bad, scored + 1000 * known

    bad, seen = engine.thread.call(compare)
    assert bad == 0
    assert seen % 1000 > 0          # resident blocks were scored by attention at the last eviction
    assert seen // 1000 > 0         # and evicted ones keep their last-known share


def test_attention_share_reaches_the_score(engine):
    def scores() -> list[tuple[float, float | None]]:
        state = engine.lifecycle.open_states()[0]
        memory = state.memory
        memory.attention.refresh(memory.seq, memory.table.resident, "adakv")
        return [(memory.score(b), memory.attention.value(b)) for b in memory.table.resident if not b.shared]

    values = engine.thread.call(scores)
    conv_id = engine.lifecycle.open_states()[0].id
    panel = [b.get("attention") for b in engine.lifecycle.latest_stats(conv_id).blocks]
    assert any(share is not None and share > 0 for share in panel)      # the memory panel's Attention column
    shares = [a for _, a in values if a is not None]
    assert shares and max(shares) == pytest.approx(1.0) and min(shares) >= 0.0
