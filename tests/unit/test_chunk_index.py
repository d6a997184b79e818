"""The chunk index on the fake KV cache: exact hits splice another conversation's cells or pool bytes; entries
follow evictions, drops, edits, parking and releases, and a stale entry is never used."""

from __future__ import annotations

import dataclasses

import pytest
from helpers.chunk_reuse import attach, copy_of
from helpers.rig import Rig

from evoke_engine.events import EventKind
from evoke_engine.kvcache.blocks import Block, BlockState
from evoke_engine.kvcache.chunk_index import ChunkIndex, chain_hash, chain_of
from evoke_engine.memory.memory import ConversationMemory

pytestmark = pytest.mark.unit


@pytest.fixture
def rig(tmp_path):
    rig = Rig(tmp_path, budget_tokens=400)
    yield rig
    rig.close()


@pytest.fixture
def chunks() -> ChunkIndex:
    return ChunkIndex()


def file_in(rig: Rig, memory: ConversationMemory, n_blocks: int = 3) -> list[Block]:
    blocks = [rig.block("file", 16) for _ in range(n_blocks)]
    attach(rig, memory, blocks)
    return blocks


def test_the_chain_covers_everything_before_a_block():
    assert chain_hash("", [1, 2]) != chain_hash("", [2, 1])
    assert chain_hash(chain_hash("", [1]), [2]) != chain_hash("", [2])
    a = Block(name="a", role="file", turn=1, tokens=[1, 2], text="")
    assert chain_of([a]) == chain_hash("", [1, 2]) and chain_of([]) == ""


def test_a_second_conversation_splices_the_same_file_from_the_first_slot(rig, chunks):
    first = rig.memory("a", 0, chunks=chunks)
    original = file_in(rig, first)
    second = rig.memory("b", 1, chunks=chunks)
    decoded_before = rig.rt.decoded_into(1)
    hits = attach(rig, second, [copy_of(b) for b in original])
    assert [h["where"] for h in hits] == ["slot"] * 3 and all(h["exact"] for h in hits)
    assert rig.rt.decoded_into(1) == decoded_before          # nothing decoded: every block spliced
    assert second.counters.reused_tokens == 48 and second.counters.prefill_tokens == 0
    assert [b.reused_from for b in second.table.resident[-3:]] == \
        [f"a:{b.name} (slot, exact)" for b in original]
    event = [e for e in second.events if e.kind is EventKind.BLOCKS_REUSED][-1]
    assert [r["block"] for r in event.detail["blocks"]] == [b.name for b in original]
    assert second.stats().reused_tokens == 48
    assert any(row["reused_from"] for row in second.stats().blocks)


def test_a_different_message_before_the_file_is_not_an_exact_match(rig, chunks):
    first = rig.memory("a", 0, chunks=chunks)
    original = file_in(rig, first)
    second = rig.memory("b", 1, chunks=chunks)
    attach(rig, second, [rig.block("user", 8)])
    assert attach(rig, second, [copy_of(b) for b in original]) == []


def test_a_reused_block_is_itself_a_source_for_a_third_conversation(rig, chunks):
    first = rig.memory("a", 0, chunks=chunks)
    original = file_in(rig, first)
    second = rig.memory("b", 1, chunks=chunks)
    attach(rig, second, [copy_of(b) for b in original])
    first.release()
    third = rig.memory("c", 2, chunks=chunks)
    hits = attach(rig, third, [copy_of(b) for b in original])
    assert [h["from"].split(":")[0] for h in hits] == ["b", "b", "b"]


def test_an_evicted_block_is_reused_from_the_pool_and_the_blocks_it_moved_are_not(rig, chunks):
    first = rig.memory("a", 0, chunks=chunks)
    original = file_in(rig, first)
    first.sequence.evict([original[0]], keep_bytes=True)       # the later two move down: K re-rotated
    assert original[0].state is BlockState.RAM
    second = rig.memory("b", 1, chunks=chunks)
    hits = attach(rig, second, [copy_of(b) for b in original])
    assert [(h["block"], h["where"]) for h in hits] == [(original[0].name, "ram")]
    assert original[0] in rig.pool                            # the source keeps its bytes
    first.check()


def test_a_dropped_block_is_not_reused(rig, chunks):
    first = rig.memory("a", 0, chunks=chunks)
    original = file_in(rig, first)
    first.sequence.evict([original[-1]], keep_bytes=False)
    second = rig.memory("b", 1, chunks=chunks)
    hits = attach(rig, second, [copy_of(b) for b in original])
    assert [h["block"] for h in hits] == [b.name for b in original[:2]]


def test_bytes_the_pool_let_go_are_not_reused(rig, chunks):
    first = rig.memory("a", 0, chunks=chunks)
    original = file_in(rig, first)
    first.sequence.evict([original[-1]], keep_bytes=True)
    rig.pool.discard(original[-1])                            # let go behind the index's back
    first.sequence.bytes_moved(original[-1], BlockState.DROPPED)
    second = rig.memory("b", 1, chunks=chunks)
    assert [h["block"] for h in attach(rig, second, [copy_of(b) for b in original])] == \
        [b.name for b in original[:2]]


def test_released_edited_and_parked_sources_are_never_used(rig, chunks):
    first = rig.memory("a", 0, chunks=chunks)
    original = file_in(rig, first)
    first.sequence.remove([original[-1]])                     # edited away (the tail: nothing moves)
    first.park()
    second = rig.memory("b", 1, chunks=chunks)
    assert attach(rig, second, [copy_of(b) for b in original]) == []     # parked: cells in an image
    rig.enter_slot(first, 0)
    second.release()
    third = rig.memory("c", 2, chunks=chunks)
    assert [h["from"] for h in attach(rig, third, [copy_of(b) for b in original])] == \
        [f"a:{b.name}" for b in original[:2]]                # back in its slot: valid again; the removed one is gone
    first.release()
    third.release()
    assert len(chunks) == 0
    fourth = rig.memory("d", 3, chunks=chunks)
    assert attach(rig, fourth, [copy_of(b) for b in original]) == []


def test_a_block_decoded_after_an_eviction_is_not_published(rig, chunks):
    first = rig.memory("a", 0, chunks=chunks)
    original = file_in(rig, first, 2)
    first.sequence.evict([original[0]], keep_bytes=False)
    later = rig.block("file", 16)
    attach(rig, first, [later])                                # attends over a moved cell: not a fresh decode
    assert not first.sequence.exact
    assert chunks.keys_of(first.sequence) == []
    assert later.state is BlockState.RESIDENT


def test_reuse_off_decodes(rig, chunks):
    first = rig.memory("a", 0, chunks=chunks)
    original = file_in(rig, first)
    off = dataclasses.replace(rig.settings, chunk_reuse=False)
    second = rig.memory("b", 1, chunks=chunks, settings=off)
    assert attach(rig, second, [copy_of(b) for b in original]) == []
    assert second.counters.prefill_tokens == 48


def test_after_another_prefix_the_same_tokens_are_reused_approximately_and_repaired(rig, chunks):
    first = rig.memory("a", 0, chunks=chunks)
    original = file_in(rig, first)
    approximate = dataclasses.replace(rig.settings, chunk_reuse_approximate=True, chunk_reuse_repair_tokens=4)
    second = rig.memory("b", 1, chunks=chunks, settings=approximate)
    attach(rig, second, [rig.block("user", 8)])                # a different first message
    decoded_before = rig.rt.decoded_into(1)
    hits = attach(rig, second, [copy_of(b) for b in original])  # the layout check: cells carry the right tokens
    assert [(h["exact"], h["repaired"], h["tokens"]) for h in hits] == [(False, 4, 12), (False, 0, 16), (False, 0, 16)]
    assert rig.rt.decoded_into(1) - decoded_before == 4         # 4 tokens after the seam, the rest spliced
    assert not second.sequence.exact
    assert len(chunks.keys_of(second.sequence)) == 1            # its own first message only: never a repaired block
    assert second.table.resident[-3].reused_from.endswith("(slot, repaired 4)")
    assert second.table.resident[-1].reused_from.endswith("(slot, repaired 0)")


def test_every_seam_is_repaired_where_runs_from_different_places_meet(rig, chunks):
    first = rig.memory("a", 0, chunks=chunks)
    original = file_in(rig, first)
    approximate = dataclasses.replace(rig.settings, chunk_reuse_approximate=True, chunk_reuse_repair_tokens=4)
    second = rig.memory("b", 1, chunks=chunks, settings=approximate)
    attach(rig, second, [rig.block("user", 8)])
    hits = attach(rig, second, [copy_of(original[0]), rig.block("user", 6), copy_of(original[1]),
                                copy_of(original[2])])
    assert [h["repaired"] for h in hits] == [4, 4, 0]


def test_approximate_reuse_is_off_by_default_and_never_takes_pool_bytes(rig, chunks):
    first = rig.memory("a", 0, chunks=chunks)
    original = file_in(rig, first)
    second = rig.memory("b", 1, chunks=chunks)
    attach(rig, second, [rig.block("user", 8)])
    assert attach(rig, second, [copy_of(b) for b in original]) == []
    first.sequence.evict(original, keep_bytes=True)
    approximate = dataclasses.replace(rig.settings, chunk_reuse_approximate=True)
    third = rig.memory("c", 2, chunks=chunks, settings=approximate)
    attach(rig, third, [rig.block("user", 8)])
    assert attach(rig, third, [copy_of(b) for b in original]) == []


def test_a_spilled_block_is_reused_from_its_file(rig, chunks):
    first = rig.memory("a", 0, chunks=chunks)
    original = file_in(rig, first)
    first.sequence.evict([original[-1]], keep_bytes=True)
    rig.pool.set_budget(0)                                     # everything saved spills to disk
    assert original[-1].state is BlockState.DISK
    second = rig.memory("b", 1, chunks=chunks)
    hits = attach(rig, second, [copy_of(b) for b in original])
    assert [h["where"] for h in hits] == ["slot", "slot", "disk"]
    assert original[-1] in rig.pool


def test_content_stays_found_while_any_holder_keeps_it(rig, chunks):
    first = rig.memory("a", 0, chunks=chunks)
    original = file_in(rig, first)
    other = rig.memory("b", 1, chunks=chunks)
    attach(rig, other, [rig.block("user", 8), *(copy_of(b) for b in original)])   # the same tokens, another chain
    other.release()                                            # the latest holder goes; the first still holds them
    approximate = dataclasses.replace(rig.settings, chunk_reuse_approximate=True, chunk_reuse_repair_tokens=4)
    third = rig.memory("c", 2, chunks=chunks, settings=approximate)
    attach(rig, third, [rig.block("user", 5)])
    hits = attach(rig, third, [copy_of(b) for b in original])
    assert [h["from"] for h in hits] == [f"a:{b.name}" for b in original]
