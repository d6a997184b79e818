"""KV primitives on the real embedded model: round trips, re-anchoring, pending shifts, sharing."""

from __future__ import annotations

import numpy as np
import pytest

from evoke_engine.runtime.kv import KVCache, SavedKV
from evoke_engine.runtime.runtime import Runtime
from evoke_engine.settings import Settings

TEXT = " ".join(f"Item {i}: the parser reads field {i} and stores the value {i * 13 % 97} in the table."
                for i in range(80))
NEEDLE_DOC = ("<|im_start|>user\n" + " ".join(f"Line {i}: the pump in room {i} runs quietly." for i in range(12))
              + " The passkey is 7431. " + " ".join(f"Line {i}: the fan in hall {i} is clean." for i in range(12, 30))
              + "\nWhat is the passkey?<|im_end|>\n<|im_start|>assistant\nThe passkey is")


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    rt = Runtime(Settings(n_ctx=4096, slots=2, home=str(tmp_path_factory.mktemp("kv"))))
    kv = KVCache(rt)
    yield rt, kv
    rt.close()


@pytest.fixture()
def clean(rig):
    rt, kv = rig
    for seq in range(rt.n_seq_max):
        kv.drop(seq)
    kv.shift_pending = False
    return rt, kv


def greedy(rt: Runtime, kv: KVCache, seq: int, n: int) -> list[int]:
    out = []
    for _ in range(n):
        token = int(np.argmax(rt.logits()))
        out.append(token)
        rt.decode([token], seq, kv.pos_max(seq) + 1)
    return out


def test_native_reanchor_is_calibrated_on_the_default_model(clean):
    rt, kv = clean
    assert kv.reanchor_note == ""
    assert kv.geometry is not None and kv.calibration_error < 1e-3


def _needle(rt: Runtime) -> tuple[list[int], int, int]:
    tokens = rt.tokenize(NEEDLE_DOC)
    key = rt.tokenize(" The passkey is 7431.")
    start = next(i for i in range(len(tokens)) if tokens[i:i + len(key)] == key)
    return tokens, start - 40, start + 40                       # an 80-token block around the needle


def test_round_trip_at_original_position_continues_identically(clean):
    rt, kv = clean
    tokens, p0, p1 = _needle(rt)
    n = len(tokens)
    rt.decode(tokens, 0, 0)
    reference_logits = rt.logits()
    reference = greedy(rt, kv, 0, 6)
    assert "7431" in rt.detokenize(reference).replace(" ", "")
    kv.drop(0)

    rt.decode(tokens[:-1], 0, 0)
    saved = kv.save(0, p0, p1)
    kv.evict(0, p0, p1, compact=False)
    kv.restore(saved, 0, p0)
    assert kv.pos_max(0) == n - 2
    rt.decode(tokens[-1:], 0, n - 1)
    logits = rt.logits()
    assert np.abs(logits - reference_logits).max() < 1.0
    assert greedy(rt, kv, 0, 6) == reference


def test_without_the_restore_the_needle_is_lost(clean):
    """Control for the round trip: the evicted block really carries the answer."""
    rt, kv = clean
    tokens, p0, p1 = _needle(rt)
    rt.decode(tokens[:-1], 0, 0)
    kv.evict(0, p0, p1)
    rt.decode(tokens[-1:], 0, kv.pos_max(0) + 1)
    assert "7431" not in rt.detokenize(greedy(rt, kv, 0, 6)).replace(" ", "")


def test_block_restored_at_the_tail_still_answers(clean):
    """Evicted with compaction, later spliced back at the tail (re-anchored): the needle is recalled."""
    rt, kv = clean
    tokens, p0, p1 = _needle(rt)
    question = rt.tokenize("\nWhat is the passkey?<|im_end|>\n<|im_start|>assistant\nThe passkey is")
    body = tokens[:len(tokens) - len(question)]
    rt.decode(body, 0, 0, logits_last=False)
    saved = kv.save(0, p0, p1)
    kv.evict(0, p0, p1)
    tail = kv.pos_max(0) + 1
    before = kv.native_reanchors
    kv.restore(saved, 0, tail)
    assert kv.native_reanchors == before + 1
    assert kv.pos_max(0) == tail + (p1 - p0) - 1
    rt.decode(question, 0, kv.pos_max(0) + 1)
    assert "7431" in rt.detokenize(greedy(rt, kv, 0, 6)).replace(" ", "")


def test_restore_at_a_new_position_matches_llama_cpp_shift(clean):
    """The native re-anchor and llama.cpp's own K-shift give the same next-token logits."""
    rt, kv = clean
    tokens = rt.tokenize(TEXT)[:500]
    rt.decode(tokens[:300], 0, 0)
    saved = kv.save(0, 50, 150)
    kv.evict(0, 50, 150)
    assert kv.pos_max(0) == 199
    rt.decode(tokens[300:320], 0, 200)                    # applies the compaction shift too

    results = []
    for native in (True, False):
        seq = 0 if native else 1
        if not native:
            kv.share(0, 1, 0, 220)
            kv.drop(1, 220, -1)
        geometry = kv.geometry
        if not native:
            kv.geometry = None
        try:
            kv.restore(SavedKV(bytearray(saved.data), saved.origin_pos, saved.n_tokens), seq, 220)
        finally:
            kv.geometry = geometry
        assert kv.pos_max(seq) == 319                      # contiguous: 220 + 100 tokens
        rt.decode(tokens[400:404], seq, 320)
        results.append((rt.logits(), greedy(rt, kv, seq, 6)))
        if native:
            kv.drop(0, 320, -1)
    (native_logits, native_tokens), (shift_logits, shift_tokens) = results
    print("native vs shift", np.abs(native_logits - shift_logits).max(), native_tokens, shift_tokens)
    assert np.abs(native_logits - shift_logits).max() < 1.0
    assert native_tokens == shift_tokens


def test_save_after_compaction_applies_the_pending_shift_first(clean):
    """Saving cells that carry a pending K-shift would store stale K (DESIGN fact 2)."""
    rt, kv = clean
    tokens = rt.tokenize(TEXT)[:300]
    rt.decode(tokens, 0, 0)
    kv.evict(0, 20, 120)                                   # [120, 300) now pending a shift to [20, 200)
    assert kv.shift_pending
    guarded = kv.save(0, 100, 164)                         # save() must flush first
    assert not kv.shift_pending and kv.shift_flushes >= 1

    kv.drop(0)
    rt.decode(tokens, 0, 0)
    kv.evict(0, 20, 120)
    kv.shift_pending = False                               # pretend nothing is pending: the hazard
    stale = kv.save(0, 100, 164)
    kv.shift_pending = True
    kv.flush_pending_shifts()
    settled = kv.save(0, 100, 164)                         # after an explicit decode: the truth

    assert bytes(guarded.data) == bytes(settled.data)
    assert bytes(stale.data) != bytes(settled.data)


def test_shared_prefix_cells_are_never_shifted(clean):
    rt, kv = clean
    prefix_seq = rt.prefix_seqs[0]
    tokens = rt.tokenize(TEXT)[:260]
    rt.decode(tokens[:60], prefix_seq, 0, logits_last=False)
    before = bytes(kv._state_of(prefix_seq))
    kv.share(prefix_seq, 0, 0, 60)
    rt.decode(tokens[60:260], 0, 60)
    kv.evict(0, 80, 180)                                   # compaction of the conversation only
    rt.decode(tokens[:1], 0, kv.pos_max(0) + 1)            # applies the shift
    assert kv.pos_max(prefix_seq) == 59
    assert kv.pos_min(0) == 0 and kv.pos_max(0) == 160
    assert bytes(kv._state_of(prefix_seq)) == before


def test_tokens_held_ahead_are_claimed_by_the_decode_that_starts_with_them(clean):
    """The next message's opening decoded ahead (with the reply's closing) and claimed later gives
    the same greedy answer as decoding the whole message at once, also after a compaction below it."""
    rt, kv = clean
    tokens, p0, p1 = _needle(rt)
    question = rt.tokenize("\nWhat is the passkey?<|im_end|>\n<|im_start|>assistant\nThe passkey is")
    body = tokens[:len(tokens) - len(question)]
    head = question[:3]
    rt.decode(body, 0, 0, logits_last=False)
    reference_start = kv.pos_max(0) + 1
    rt.decode(question, 0, reference_start)
    reference = greedy(rt, kv, 0, 6)
    assert "7431" in rt.detokenize(reference).replace(" ", "")
    kv.drop(0, reference_start, -1)

    rt.decode(head, 0, reference_start, logits_last=False)
    kv.hold_ahead(0, reference_start, head)
    assert kv.ahead_tokens(0) == 3 and kv.pos_max(0) == reference_start + 2
    assert kv.claim_ahead(0, reference_start, head) == 0           # one token must be left for logits
    assert kv.pos_max(0) == reference_start - 1                     # ...so the held cells were dropped

    rt.decode(head, 0, reference_start, logits_last=False)
    kv.hold_ahead(0, reference_start, head)
    kv.evict(0, 0, 10)                                              # compaction below: they move along
    at = reference_start - 10
    assert kv.ahead_tokens(0) == 3 and kv.pos_max(0) == at + 2
    done = kv.claim_ahead(0, at, question)
    assert done == 3 and kv.ahead_tokens(0) == 0
    rt.decode(question[done:], 0, at + done)
    assert "7431" in rt.detokenize(greedy(rt, kv, 0, 6)).replace(" ", "")


def test_a_held_opening_moves_past_a_block_restored_at_its_start_and_the_answer_is_the_same(clean):
    """A block brought back at the tail lands where the next message's opening was held: the opening (the role
    header) moves up past it instead of being decoded again, the words after it are dropped, and the greedy
    answer equals the one where the whole question is decoded after the block."""
    rt, kv = clean
    tokens, p0, p1 = _needle(rt)
    question = rt.tokenize("\nWhat is the passkey?<|im_end|>\n<|im_start|>assistant\nThe passkey is")
    body = tokens[:len(tokens) - len(question)]
    head, draft = question[:3], question[3:6]

    def needle_evicted() -> tuple[SavedKV, int]:
        kv.drop(0)
        rt.decode(body, 0, 0, logits_last=False)
        saved = kv.save(0, p0, p1)
        kv.evict(0, p0, p1)
        return saved, kv.pos_max(0) + 1

    saved, at = needle_evicted()                  # the reference: the block back, then the whole question
    kv.restore(saved, 0, at)
    rt.decode(question, 0, at + (p1 - p0))
    reference = greedy(rt, kv, 0, 6)
    assert "7431" in rt.detokenize(reference).replace(" ", "")

    saved, at = needle_evicted()
    rt.decode([*head, *draft], 0, at, logits_last=False)
    kv.hold_ahead(0, at, [*head, *draft], opening=len(head))
    kv.restore(saved, 0, at, before_opening=True)
    moved_to = at + (p1 - p0)
    assert kv.held_ahead(0) == head and kv.pos_max(0) == moved_to + len(head) - 1
    assert kv.claim_ahead(0, moved_to, question) == len(head)
    rt.decode(question[len(head):], 0, moved_to + len(head))
    assert greedy(rt, kv, 0, 6) == reference


@pytest.mark.parametrize("operation", ["restore", "drop", "share", "evict_in_place", "mismatch"])
def test_any_other_operation_drops_the_tokens_held_ahead(clean, operation):
    rt, kv = clean
    tokens = rt.tokenize(TEXT)[:200]
    rt.decode(tokens[:150], 0, 0, logits_last=False)
    saved = kv.save(0, 20, 40)
    rt.decode(tokens[150:153], 0, 150, logits_last=False)
    kv.hold_ahead(0, 150, tokens[150:153])
    if operation == "restore":
        kv.restore(saved, 0, 150)
        assert kv.pos_max(0) == 169                                 # landed where the held cells were
    elif operation == "drop":
        kv.drop(0, 100, -1)
        assert kv.pos_max(0) == 99
    elif operation == "share":
        kv.share(0, 1, 0, 150)                                      # below them: the source keeps them
        assert kv.ahead_tokens(0) == 3 and kv.pos_max(1) == 149
        kv.share(0, 1)
        assert kv.pos_max(0) == 149 and kv.pos_max(1) == 149
    elif operation == "evict_in_place":
        kv.evict(0, 100, 120, compact=False)                        # nothing moves: they would sit past a gap
        assert kv.pos_max(0) == 149
    else:
        assert kv.claim_ahead(0, 150, tokens[151:160]) == 0
        assert kv.pos_max(0) == 149
    assert kv.ahead_tokens(0) == 0


def test_runtime_refuses_calls_from_another_thread(clean):
    import threading

    rt, _ = clean
    errors = []
    thread = threading.Thread(target=lambda: errors.append(_call(rt.tokenize, "hello")))
    thread.start()
    thread.join()
    assert isinstance(errors[0], RuntimeError)


def _call(fn, *args):
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001
        return exc
    return None


def test_q8_0_cache_falls_back_to_llama_cpp_shift_and_still_recalls(tmp_path):
    rt = Runtime(Settings(n_ctx=1024, slots=1, kv_cache_type="q8_0", home=str(tmp_path)))
    try:
        kv = KVCache(rt)
        assert kv.geometry is None and "K-shift" in kv.reanchor_note
        tokens, p0, p1 = _needle(rt)
        question = rt.tokenize("\nWhat is the passkey?<|im_end|>\n<|im_start|>assistant\nThe passkey is")
        rt.decode(tokens[:len(tokens) - len(question)], 0, 0, logits_last=False)
        saved = kv.save(0, p0, p1)
        kv.evict(0, p0, p1)
        kv.restore(saved, 0, kv.pos_max(0) + 1)
        assert kv.shift_pending
        rt.decode(question, 0, kv.pos_max(0) + 1)
        assert "7431" in rt.detokenize(greedy(rt, kv, 0, 6)).replace(" ", "")
    finally:
        rt.close()


def test_every_slot_gets_the_prefix_bytes_at_the_same_cells_and_decodes_alike(clean):
    """With a KV stream per slot, the prefix decoded once in its own context and spliced into each slot's stream
    gives the same logits, bit for bit, in every slot: no slot holds its conversation at other cells than another
    (issue 58 item 7: the same request gave another text in the slot whose context also held the prefixes)."""
    rt, kv = clean
    assert rt.layout == "streams" and rt.n_contexts == 2
    prefix_seq = rt.prefix_seqs[0]
    assert not kv.same_cells(0, 1) and not kv.same_cells(prefix_seq, 0) and kv.same_cells(prefix_seq, rt.scratch_seq)
    tokens = rt.tokenize(TEXT)
    rt.decode(tokens[:200], prefix_seq, 0, logits_last=False)
    for seq in (0, 1):
        kv.share(prefix_seq, seq, 0, 200)                  # another context: a copy of the bytes
        assert kv.pos_max(seq) == 199 and kv.pos_min(seq) == 0
    logits = []
    for seq in (0, 1):
        rt.decode(tokens[200:240], seq, 200)
        logits.append(rt.logits())
    assert np.array_equal(logits[0], logits[1])
    kv.drop(0)
    kv.share(prefix_seq, 0, 0, 200)                         # again, after a stream was emptied
    rt.decode(tokens[200:240], 0, 200)
    assert np.array_equal(rt.logits(), logits[1])


def test_flash_attention_auto_is_off_only_where_it_is_slower_and_optional():
    from evoke_engine.runtime.runtime import resolve_flash_attention

    assert resolve_flash_attention("auto", "f16", on_gpu=False) == "off"
    assert resolve_flash_attention("auto", "f16", on_gpu=True) == "on"
    assert resolve_flash_attention("auto", "q8_0", on_gpu=False) == "on"     # a quantised V cache needs it
    assert resolve_flash_attention("on", "f16", on_gpu=False) == "on"


def test_a_known_prefix_is_found_without_rendering_or_tokenizing_again(clean, monkeypatch):
    """Every open and slot change asks for the conversation's prefix: a known one is found by its system
    message alone; another prompt, or one whose prefix was displaced, is tokenized (and decoded) anew."""
    from evoke_engine.kvcache.prefixes import SharedPrefixes
    from evoke_engine.runtime.template import ChatTemplate

    rt, kv = clean
    template = ChatTemplate(rt.meta("tokenizer.chat_template"), bos_token=rt.token_text("bos"),
                            eos_token=rt.token_text("eos"))
    prefixes = SharedPrefixes(rt, kv, template)
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    first = prefixes.for_conversation("You review code.", tools)
    calls = []
    original = rt.tokenize
    monkeypatch.setattr(rt, "tokenize", lambda *a, **k: calls.append(a) or original(*a, **k))
    assert prefixes.for_conversation("You review code.", tools) is first and calls == []
    other = prefixes.for_conversation("You write tests.", tools)
    assert other.key != first.key and calls
    for i in range(len(prefixes.seqs)):                     # displace the first prefix
        prefixes.for_conversation(f"Prompt {i}.", [])
    assert first.key not in {p.key for p in prefixes.all()}
    again = prefixes.for_conversation("You review code.", tools)
    assert again is not first and again.key == first.key and again.tokens == first.tokens
    prefixes.clear()
    for seq in rt.prefix_seqs:
        kv.drop(seq)


def test_a_block_mapped_from_a_file_is_rotated_in_a_copy_and_splices_alike(clean, tmp_path):
    """A block whose bytes are a copy-on-write map of a KV file (a reopened conversation) is re-anchored in
    a private copy: the same logits as the same bytes held in RAM, and the mapped bytes and their anchor
    stay as the file has them. Both sequences live the same history in streams of their own, so their cells sit
    alike: a shared copy of a holed sequence is contiguous, and the CPU attention's rounding follows cell placement
    (on an AVX2 CPU the sums agree only where cells move by a multiple of 32: issue 58 item 7)."""
    import mmap

    rt, kv = clean
    assert not kv.same_cells(0, 1)
    tokens = rt.tokenize(TEXT)[:400]
    for seq in (0, 1):
        rt.decode(tokens[:300], seq, 0)
    saved = kv.save(0, 50, 150)
    path = tmp_path / "block.bin"
    path.write_bytes(bytes(saved.data))
    for seq in (0, 1):
        kv.evict(seq, 50, 150)
    logits = []
    with open(path, "rb") as file:
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
    view = memoryview(mapped)
    for seq, data in ((0, bytearray(saved.data)), (1, view)):
        block = SavedKV(data, saved.origin_pos, saved.n_tokens)
        kv.restore(block, seq, 200)
        assert kv.pos_max(seq) == 299
        rt.decode(tokens[300:310], seq, 300)
        logits.append(rt.logits())
        if seq == 1:
            assert bytes(view) == path.read_bytes() and block.origin_pos == 50
        elif kv._direct_for(0) is None:
            assert block.origin_pos == 200                 # the serialised path rotates a RAM block in place
        else:
            assert block.origin_pos == 50                  # the direct path rotates as it copies: bytes untouched
    assert np.array_equal(logits[0], logits[1])
    view.release()
    mapped.close()


def test_ranges_evicted_at_once_leave_the_cells_one_by_one_evictions_leave(clean):
    """`evict_ranges` moves each later cell once, by all that left before it: the same positions and, after the
    K-shift, the same K and V bytes as evicting the ranges one at a time, last first."""
    rt, kv = clean
    tokens = rt.tokenize(TEXT)[:400]
    ranges = [(30, 62), (62, 90), (150, 180), (300, 332)]
    rt.decode(tokens, 0, 0, logits_last=False)
    for p0, p1 in reversed(ranges):
        kv.evict(0, p0, p1)
    kv.flush_pending_shifts()
    one_by_one = bytes(kv._state_of(0))
    kv.drop(0)
    rt.decode(tokens, 0, 0, logits_last=False)
    kv.evict_ranges(0, [(150, 180), (30, 62), (300, 332), (62, 90)])      # any order given
    assert kv.shift_pending and kv.pos_max(0) == len(tokens) - 1 - sum(p1 - p0 for p0, p1 in ranges)
    kv.flush_pending_shifts()
    assert bytes(kv._state_of(0)) == one_by_one
