"""The direct KV data path on the real embedded model: the bytes are llama.cpp's, both ways, and a block lands in the
cells the cell table gives it (a copy into the wrong cells is caught here)."""

from __future__ import annotations

import numpy as np
import pytest

from evoke_engine.runtime import kv_direct, reanchor
from evoke_engine.runtime.kv import KVCache, SavedKV
from evoke_engine.runtime.runtime import Runtime
from evoke_engine.settings import Settings

NEEDLE_DOC = ("<|im_start|>user\n" + " ".join(f"Line {i}: the pump in room {i} runs quietly." for i in range(12))
              + " The passkey is 7431. " + " ".join(f"Line {i}: the fan in hall {i} is clean." for i in range(12, 30))
              + "\nWhat is the passkey?<|im_end|>\n<|im_start|>assistant\nThe passkey is")


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    # a context a slot: these compare the direct path with llama.cpp's serialised one, which moves a block through
    # the scratch sequence in the slot's own context (a KV stream per slot moves blocks by the direct path only)
    rt = Runtime(Settings(n_ctx=4096, slots=2, slot_layout="contexts", home=str(tmp_path_factory.mktemp("kvd"))))
    kv = KVCache(rt)
    yield rt, kv
    rt.close()


@pytest.fixture()
def clean(rig):
    rt, kv = rig
    kv_direct.set_test_row_offset(0)
    for seq in range(rt.n_seq_max):
        kv.drop(seq)
    for context in range(rt.n_contexts):             # the scratch, where a test used it in a slot's own context
        kv._seq_rm(kv.scratch, -1, -1, context)
    kv.shift_pending = False
    kv.use_direct = True
    yield rt, kv
    kv_direct.set_test_row_offset(0)


def _needle(rt: Runtime) -> tuple[list[int], int, int]:
    tokens = rt.tokenize(NEEDLE_DOC)
    key = rt.tokenize(" The passkey is 7431.")
    start = next(i for i in range(len(tokens)) if tokens[i:i + len(key)] == key)
    return tokens, start - 40, start + 40


def greedy(rt: Runtime, kv: KVCache, seq: int, n: int) -> list[int]:
    out = []
    for _ in range(n):
        token = int(np.argmax(rt.logits()))
        out.append(token)
        rt.decode([token], seq, kv.pos_max(seq) + 1)
    return out


def serialised(kv: KVCache, seq: int) -> bytes:
    """The state of `seq` as llama.cpp reads it out of the cache through its own cell table."""
    return bytes(kv._state_of(seq))


def test_the_direct_path_is_on_and_calibrated_on_the_default_model(clean):
    rt, kv = clean
    assert kv.direct_note == ""
    assert kv._direct_for(0).on_host                 # the CPU backend: the re-anchor is fused with the copy


def test_a_direct_save_is_byte_for_byte_llama_cpps_serialisation(clean):
    rt, kv = clean
    tokens, p0, p1 = _needle(rt)
    rt.decode(tokens, 0, 0, logits_last=False)
    before = kv.direct_saves
    direct = kv.save(0, p0, p1)
    assert kv.direct_saves == before + 1
    kv.use_direct = False
    assert bytes(direct.data) == bytes(kv.save(0, p0, p1).data)


def test_a_block_restored_in_other_cells_continues_as_the_never_evicted_sequence(clean):
    rt, kv = clean
    tokens, p0, p1 = _needle(rt)
    n = len(tokens)
    rt.decode(tokens, 0, 0)
    reference_logits, reference = rt.logits(), greedy(rt, kv, 0, 6)
    assert "7431" in rt.detokenize(reference).replace(" ", "")
    kv.drop(0)

    rt.decode(tokens[:-1], 0, 0)
    saved = kv.save(0, p0, p1)
    cells_before = [kv._direct_for(0).cell_of(0, p) for p in range(p0, p1)]
    kv.evict(0, p0, p1, compact=False)
    rt.decode(tokens[:p1 - p0], kv.scratch, 0, logits_last=False, context=0)   # the freed cells are taken
    kv.restore(saved, 0, p0)
    kv.drop(kv.scratch)
    cells_after = [kv._direct_for(0).cell_of(0, p) for p in range(p0, p1)]
    assert cells_after != cells_before and -1 not in cells_after
    assert kv.direct_restores >= 1
    rt.decode(tokens[-1:], 0, n - 1)
    assert np.abs(rt.logits() - reference_logits).max() < 1.0
    assert greedy(rt, kv, 0, 6) == reference


def test_a_direct_restore_reads_back_through_llama_cpps_cell_table(clean):
    """At the saved positions the state llama.cpp reads is the saved bytes; re-anchored, the native rotation's."""
    rt, kv = clean
    tokens, p0, p1 = _needle(rt)
    rt.decode(tokens, 0, 0, logits_last=False)
    saved = kv.save(0, p0, p1)
    target = kv.scratch
    kv.restore(SavedKV(saved.data, p0, saved.n_tokens), target, p0)
    assert serialised(kv, target)[8:] == bytes(saved.data)[8:]      # past the magic and the saved seq id
    kv.drop(target)

    delta = 700
    kv.restore(SavedKV(saved.data, p0, saved.n_tokens), target, p0 + delta)
    expected = bytearray(saved.data)
    reanchor.shift(expected, reanchor.parse(expected, kv.geometry), kv.geometry, delta)
    assert serialised(kv, target)[8:] == bytes(expected)[8:]
    kv.drop(target)


def test_rows_copied_into_the_wrong_cells_are_caught(clean):
    """The checks above fail when the rows land one cell off the cells the table marks."""
    rt, kv = clean
    tokens, p0, p1 = _needle(rt)
    rt.decode(tokens[:-1], 0, 0)
    saved = kv.save(0, p0, p1)
    kv.evict(0, p0, p1, compact=False)
    kv_direct.set_test_row_offset(1)
    kv.restore(saved, 0, p0)
    kv_direct.set_test_row_offset(0)
    moved = serialised(kv, 0)
    kv.use_direct = False
    kv.evict(0, p0, p1, compact=False)
    kv.restore(SavedKV(bytearray(saved.data), p0, saved.n_tokens), 0, p0)
    assert moved != serialised(kv, 0)


def test_the_bytes_written_by_either_path_restore_by_the_other(clean):
    rt, kv = clean
    tokens, p0, p1 = _needle(rt)
    rt.decode(tokens, 0, 0, logits_last=False)
    direct = kv.save(0, p0, p1)
    kv.drop(0)
    kv.use_direct = False
    kv.restore(SavedKV(bytearray(direct.data), p0, direct.n_tokens), 0, p0 + 300)
    by_llama = serialised(kv, 0)
    kv.drop(0)
    kv.use_direct = True
    kv.restore(SavedKV(bytearray(direct.data), p0, direct.n_tokens), 0, p0 + 300)
    kv.flush_pending_shifts()
    assert serialised(kv, 0) == by_llama


def test_a_restore_onto_positions_the_sequence_holds_goes_the_serialised_way(clean):
    """The direct path never gives a position a second cell; llama.cpp's path does, as it always did."""
    rt, kv = clean
    tokens, p0, p1 = _needle(rt)
    rt.decode(tokens, 0, 0, logits_last=False)
    saved = kv.save(0, p0, p1)
    before = kv.direct_restores
    with pytest.raises(kv_direct.DirectError, match="already holds"):
        kv._direct_for(0).restore(saved.data, 0, 10)
    kv.restore(saved, 0, p0 + 10)
    assert kv.direct_restores == before


def test_the_serialised_path_is_kept_where_the_setting_turns_the_direct_one_off(tmp_path):
    rt = Runtime(Settings(n_ctx=2048, slots=1, home=str(tmp_path), kv_direct=False))
    try:
        kv = KVCache(rt)
        tokens = rt.tokenize(NEEDLE_DOC)
        rt.decode(tokens, 0, 0, logits_last=False)
        saved = kv.save(0, 10, 60)
        kv.evict(0, 10, 60)
        kv.restore(saved, 0, kv.pos_max(0) + 1)
        assert kv.direct_saves == kv.direct_restores == 0
    finally:
        rt.close()


def test_a_deferred_save_lands_the_same_bytes_as_a_save_though_its_cells_are_reused_at_once(clean):
    rt, kv = clean
    tokens, p0, p1 = _needle(rt)
    rt.decode(tokens, 0, 0, logits_last=False)
    at_once = bytes(kv.save(0, p0, p1).data)
    deferred = kv.save_deferred(0, p0, p1)
    assert deferred.pending is not None and kv.deferred_saves >= 1
    kv.evict(0, p0, p1)                                     # the cells are free while the rows may still copy
    rt.decode(tokens[:p1 - p0], kv.scratch, 0, logits_last=False, context=0)   # joins first, then reuses them
    kv.drop(kv.scratch)
    deferred.wait()
    assert bytes(deferred.data) == at_once
    kv.restore(deferred, 0, kv.pos_max(0) + 1)              # and it splices like any saved block
    assert kv.pos_max(0) == len(tokens) - 1


def test_direct_saves_are_written_into_the_host_arena_and_give_it_back(clean):
    rt, kv = clean
    assert kv.arena is not None and kv.arena.pinned_bytes == 0      # the CPU build: pre-faulted, pageable
    tokens, p0, p1 = _needle(rt)
    rt.decode(tokens, 0, 0, logits_last=False)
    before = kv.arena.used_bytes
    saved = kv.save(0, p0, p1)
    assert isinstance(saved.data, memoryview) and kv.arena.used_bytes >= before + saved.nbytes
    del saved
    assert kv.arena.used_bytes == before


def test_a_pending_k_shift_is_applied_to_the_moved_cells_without_a_decode(clean):
    """On the CPU the engine rotates the cells an eviction moved itself (no flush decode, no K-shift graph over
    every cell of the cache): the K rows llama.cpp's own shift gives, and the same continuation."""
    rt, kv = clean
    tokens, _, _ = _needle(rt)
    n, k = len(tokens), 16
    geometry, kv.geometry = kv.geometry, None              # the reference: llama.cpp's own K-shift
    try:
        rt.decode(tokens[:-1], 0, 0, logits_last=False)
        kv.evict(0, 8, 8 + k)
        native = kv.native_shifts
        kv.flush_pending_shifts()
        assert kv.native_shifts == native
        theirs = np.frombuffer(serialised(kv, 0), dtype=np.float16).astype(np.float32)
        rt.decode(tokens[-1:], 0, n - 1 - k)
        reference_logits, reference = rt.logits(), greedy(rt, kv, 0, 6)
    finally:
        kv.geometry = geometry
    kv.drop(0)
    rt.decode(tokens[:-1], 0, 0, logits_last=False)
    kv.evict(0, 8, 8 + k)
    native = kv.native_shifts
    kv.flush_pending_shifts()
    assert kv.native_shifts == native + 1 and not kv._direct_for(0).shift_pending
    ours = np.frombuffer(serialised(kv, 0), dtype=np.float16).astype(np.float32)
    finite = np.isfinite(theirs)                         # header and cell records read as f16: compared as bits
    assert np.array_equal(finite, np.isfinite(ours))
    assert np.allclose(ours[finite], theirs[finite], rtol=1e-2, atol=1e-2)
    rt.decode(tokens[-1:], 0, n - 1 - k)
    assert np.abs(rt.logits() - reference_logits).max() < 1.0
    assert greedy(rt, kv, 0, 6) == reference

    kv.evict(0, 8, 8 + k)                                # before a decode, without a flush: the decode's hook
    native = kv.native_shifts
    rt.decode(tokens[-1:], 0, kv.pos_max(0) + 1)
    assert kv.native_shifts == native + 1
