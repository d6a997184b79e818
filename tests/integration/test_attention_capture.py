"""The attention capture on the real embedded model: its weights against llama.cpp's own softmax,
its K store against the K llama.cpp holds, through shared prefixes, compaction and restores."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.attention_build import ensure_library

from evoke_engine.kvcache.blocks import Block, BlockState, BlockTable
from evoke_engine.runtime import reanchor
from evoke_engine.runtime.kv import KVCache
from evoke_engine.runtime.runtime import Runtime
from evoke_engine.settings import Settings

PREFIX = "<|im_start|>system\nYou are a careful assistant that reads attached files.<|im_end|>\n"
DOC = " ".join(f"Line {i}: the pump in room {i} runs at {i * 7 % 50} litres a minute." for i in range(24))
CONV = 0


def _rig(tmp_path_factory, flash: str):
    ensure_library()
    from evoke_engine.runtime.attention import AttentionCapture

    capture = AttentionCapture.create()
    rt = Runtime(Settings(n_ctx=2048, slots=2, flash_attention=flash,
                          home=str(tmp_path_factory.mktemp(f"attn-{flash}"))), eval_callback=capture)
    assert capture.attach(rt, scored_seqs=range(2)) == ""
    kv = KVCache(rt, mirror=capture)
    return rt, kv, capture


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    rt, kv, capture = _rig(tmp_path_factory, "off")
    yield rt, kv, capture
    rt.close()
    capture.close()


def _conversation(rt: Runtime, kv: KVCache) -> BlockTable:
    """A shared prefix, then four document blocks; the second is evicted with compaction and
    restored at the tail, as ConversationMemory does. Returns the table that places every block."""
    for seq in range(rt.n_seq_max):
        kv.drop(seq)
    prefix_seq = rt.prefix_seqs[0]
    table = BlockTable()
    prefix_tokens = rt.tokenize(PREFIX)
    rt.decode(prefix_tokens, prefix_seq, 0, logits_last=False)
    kv.share(prefix_seq, CONV)
    table.append(Block(name="system", role="system", turn=0, tokens=prefix_tokens, text=PREFIX, shared=True))
    doc = rt.tokenize(DOC)
    for i in range(4):
        tokens = doc[i * 64:(i + 1) * 64]
        rt.decode(tokens, CONV, table.active_tokens, logits_last=False)
        table.append(Block(name=f"file:doc#{i}", role="file", turn=1, tokens=tokens, text=""))
    victim = table.by_name("file:doc#1")
    saved = kv.save(CONV, victim.pos, victim.end)
    kv.evict(CONV, victim.pos, victim.end)
    table.remove_resident(victim, BlockState.RAM)
    kv.flush_pending_shifts()
    kv.restore(saved, CONV, table.active_tokens)
    table.place_at_tail(victim)
    table.check()
    assert kv.pos_max(CONV) == table.active_tokens - 1
    return table


def _state_positions(kv: KVCache, seq: int, geometry) -> tuple[np.ndarray, bytes, reanchor.BlobLayout]:
    """Positions of `seq`'s cells in llama.cpp's cell order, with the state blob they came from."""
    blob = bytes(kv._state_of(seq))
    layout = reanchor.parse(blob, geometry)
    assert layout is not None
    positions = np.ndarray((layout.n_cells,), dtype="<i4", buffer=blob, offset=layout.positions_offset,
                           strides=(layout.cell_stride,)).copy()
    return positions, blob, layout


def test_captured_weights_equal_llama_cpp_softmax(rig):
    rt, kv, capture = rig
    table = _conversation(rt, kv)
    positions, _, _ = _state_positions(kv, CONV, capture.geometry)
    assert sorted(positions.tolist()) == list(range(table.active_tokens))   # llama.cpp and the table agree
    capture.set_probe(True)
    try:
        query = rt.tokenize(" Which room runs at 21 litres?")
        rt.decode(query, CONV, table.active_tokens)
    finally:
        capture.set_probe(False)
    query_pos, ours_pos, ours = capture.last_query()
    assert query_pos == table.active_tokens + len(query) - 1
    assert ours_pos.tolist() == list(range(query_pos + 1))

    theirs, mask = capture.probe(rt.n_ctx)
    assert theirs.shape[0] == capture.n_head == ours.shape[0]
    # The cells this token attends to (mask 0), in cell order, are the sequence's cells in the same
    # order as llama.cpp writes them to its state: that gives each weight its position.
    attended = np.nonzero(mask == 0)[0]
    positions, _, _ = _state_positions(kv, CONV, capture.geometry)
    assert len(attended) == len(positions) == query_pos + 1
    by_position = np.empty_like(theirs[:, attended])
    by_position[:, positions] = theirs[:, attended]
    assert np.allclose(by_position.sum(axis=1), 1.0, atol=1e-4)
    assert np.abs(ours - by_position).max() < 1e-3
    # the restored block (now at the tail, moved from where it was decoded) is part of it
    restored = table.by_name("file:doc#1")
    assert np.abs(ours[:, restored.pos:restored.end] - by_position[:, restored.pos:restored.end]).max() < 1e-3


def test_k_store_equals_llama_cpp_k_after_compaction_and_restore(rig):
    rt, kv, capture = rig
    table = _conversation(rt, kv)
    kv.flush_pending_shifts()
    layer = capture.layers[0]
    positions, blob, layout = _state_positions(kv, CONV, capture.geometry)
    width = capture.geometry.n_head_kv * capture.geometry.head_dim
    start = layout.k_offsets[layer]
    theirs = np.frombuffer(blob, dtype=np.float16, count=layout.n_cells * width, offset=start)
    theirs = theirs.reshape(layout.n_cells, width).astype(np.float32)
    present, rows = capture.k_rows(CONV, layer)
    assert present[:table.active_tokens].all() and len(present) == table.active_tokens
    ours = rows[positions].astype(np.float32)
    ulp = np.spacing(np.abs(theirs).astype(np.float16)).astype(np.float32)
    # within f16 rounding: rows decoded in place, rows moved down 64 by the compaction (re-rotated
    # by us and by llama.cpp's K-shift) and the restored block (re-anchored at the tail)
    assert (np.abs(ours - theirs) <= 2 * ulp).all()


def test_capture_runs_with_flash_attention_on(tmp_path_factory):
    rt, kv, capture = _rig(tmp_path_factory, "on")
    try:
        table = _conversation(rt, kv)
        rt.decode(rt.tokenize(" Which room?"), CONV, table.active_tokens)
        query_pos, positions, weights = capture.last_query()
        assert positions.tolist() == list(range(query_pos + 1))
        assert np.allclose(weights.sum(axis=1), 1.0, atol=1e-4)
        view = capture.view(CONV)
        assert view.steps > 0 and view.mass_mean[:table.active_tokens].sum() > 0
        assert view.mass_adakv[:table.active_tokens].sum() > 0
    finally:
        rt.close()
        capture.close()
