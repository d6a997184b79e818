"""KV-file entries of the chunk index on the fake KV cache: a closed conversation's exact blocks (its snapshot's
"chunks") are spliced from its file when no open conversation holds them; a file that no longer verifies, or
fails while being read, is forgotten and the block decoded with nothing half-applied; a snapshot names exactly
the blocks the index holds exactly, and a loaded one registers them again."""

from __future__ import annotations

import pytest
from helpers.chunk_reuse import attach, copy_of
from helpers.rig import Rig

from evoke_engine.errors import RestoreError
from evoke_engine.events import EventKind
from evoke_engine.kvcache.blocks import Block, BlockState
from evoke_engine.kvcache.chunk_index import ChunkIndex, FileChunk
from evoke_engine.memory.chunk_files import file_chunks
from evoke_engine.memory.memory import ConversationMemory
from evoke_engine.memory.snapshot import decode_payload, encode_payload
from evoke_engine.runtime.kv import SavedKV

pytestmark = pytest.mark.unit


class FakeFiles:
    """`ChunkFiles` over bytes saved from the cells when a conversation "is written" (the KV file's K/V)."""

    def __init__(self) -> None:
        self.bytes: dict[tuple[str, int], SavedKV] = {}
        self.valid: set[str] = set()
        self.fail_read: set[str] = set()
        self.reads = 0

    def write(self, rig: Rig, memory: ConversationMemory, chunks: ChunkIndex) -> None:
        snapshot = memory.snapshot("prefix", [])
        entries = file_chunks(memory.id, snapshot.blocks, snapshot.chunks, {})
        for _key, chunk in entries:
            block = snapshot.blocks[chunk.block_index]
            if block.state is BlockState.RESIDENT:
                saved = rig.kv.save(memory.seq, chunk.origin, chunk.origin + chunk.n_tokens)
            else:
                data, origin, n_tokens = rig.pool.peek_bytes(block)
                saved = SavedKV(bytearray(data), origin, n_tokens)
            self.bytes[(memory.id, chunk.block_index)] = saved
        self.valid.add(memory.id)
        chunks.set_file(memory.id, entries)

    def worth(self, chunk: FileChunk, run_bytes: int) -> bool:
        return True

    def holds(self, key: str, chunk: FileChunk) -> bool:
        return chunk.conversation_id in self.valid and (chunk.conversation_id, chunk.block_index) in self.bytes

    def read(self, key: str, chunk: FileChunk) -> SavedKV:
        self.reads += 1
        if chunk.conversation_id in self.fail_read:
            raise RestoreError("the file went away while being read")
        saved = self.bytes[(chunk.conversation_id, chunk.block_index)]
        return SavedKV(bytearray(saved.data), saved.origin_pos, saved.n_tokens)


@pytest.fixture
def rig(tmp_path):
    rig = Rig(tmp_path, budget_tokens=400)
    yield rig
    rig.close()


@pytest.fixture
def files() -> FakeFiles:
    return FakeFiles()


@pytest.fixture
def chunks(files) -> ChunkIndex:
    return ChunkIndex(files=files)


def closed_with_file(rig: Rig, chunks: ChunkIndex, files: FakeFiles, name: str = "a") -> list[Block]:
    first = rig.memory(name, 0, chunks=chunks)
    original = [rig.block("file", 16) for _ in range(3)]
    attach(rig, first, original)
    files.write(rig, first, chunks)
    first.release()
    return original


def test_a_closed_conversations_file_blocks_are_spliced_from_its_file(rig, chunks, files):
    original = closed_with_file(rig, chunks, files)
    assert len(chunks) == 0 and chunks.file_entries() == 3
    second = rig.memory("b", 1, chunks=chunks)
    decoded_before = rig.rt.decoded_into(1)
    hits = attach(rig, second, [copy_of(b) for b in original])
    assert [(h["where"], h["exact"], h["from"]) for h in hits] == [("file", True, f"a:{b.name}") for b in original]
    assert rig.rt.decoded_into(1) == decoded_before                    # nothing decoded
    assert second.table.resident[-1].reused_from == f"a:{original[-1].name} (file, exact)"
    assert len(chunks.keys_of(second.sequence)) == 3                  # spliced exactly: published from its slot
    third = rig.memory("c", 2, chunks=chunks)
    assert [h["where"] for h in attach(rig, third, [copy_of(b) for b in original])] == ["slot"] * 3


def test_a_slot_source_is_preferred_to_the_file(rig, chunks, files):
    original = closed_with_file(rig, chunks, files)
    second = rig.memory("b", 1, chunks=chunks)
    attach(rig, second, [copy_of(b) for b in original])
    reads = files.reads
    third = rig.memory("c", 2, chunks=chunks)
    attach(rig, third, [copy_of(b) for b in original])
    assert files.reads == reads


def test_a_file_that_no_longer_verifies_is_forgotten_and_the_blocks_decoded(rig, chunks, files):
    original = closed_with_file(rig, chunks, files)
    files.valid.discard("a")                                          # deleted or changed since it was indexed
    second = rig.memory("b", 1, chunks=chunks)
    assert attach(rig, second, [copy_of(b) for b in original]) == []
    assert chunks.file_entries() == 0 and files.reads == 0
    assert second.counters.prefill_tokens == 48


def test_a_file_failing_while_read_decodes_with_nothing_half_applied(rig, chunks, files):
    original = closed_with_file(rig, chunks, files)
    files.fail_read.add("a")
    second = rig.memory("b", 1, chunks=chunks)
    before = second.active_tokens
    assert attach(rig, second, [copy_of(b) for b in original]) == []
    assert second.active_tokens == before + 48 and second.counters.reused_tokens == 0
    assert chunks.file_entries() == 0 and files.reads == 1            # forgotten after the first failure
    assert [e for e in second.events if e.kind is EventKind.ERROR]    # said once, then decoded


def test_a_conversation_never_reuses_its_own_file(rig, chunks, files):
    first = rig.memory("a", 0, chunks=chunks)
    original = [rig.block("file", 16) for _ in range(2)]
    attach(rig, first, original)
    files.write(rig, first, chunks)
    first.release()
    again = rig.memory("a", 1, chunks=chunks)                          # the same id, rebuilt
    assert attach(rig, again, [copy_of(b) for b in original]) == []


def test_a_snapshot_names_exactly_the_blocks_held_exactly(rig, chunks):
    first = rig.memory("a", 0, chunks=chunks)
    blocks = [rig.add(first, "file", 16) for _ in range(4)]
    first.sequence.evict([blocks[1]], keep_bytes=True)                # saved at its origin; the later two move
    records = first.snapshot("prefix", []).chunks
    index = {b.name: i for i, b in enumerate(first.table.blocks)}
    assert sorted(records) == sorted(index[b.name] for b in blocks[:2])
    assert records[index[blocks[0].name]][1] == blocks[0].pos
    assert records[index[blocks[1].name]][1] == rig.prefix_tokens + 16   # the saved block's origin


def test_a_loaded_snapshot_registers_its_exact_blocks_again(rig, chunks):
    first = rig.memory("a", 0, chunks=chunks)
    blocks = [rig.add(first, "file", 16) for _ in range(3)]
    first.sequence.evict([blocks[2]], keep_bytes=True)                # the tail: nothing moves
    first.park()
    payload = encode_payload(first.snapshot("prefix", [{"role": "user", "content": "x", "evoke_turn": 1}]))
    first.release()
    assert len(chunks) == 0
    loaded = ConversationMemory("a", settings=rig.settings, runtime=rig.rt, kv=rig.kv, pool=rig.pool,
                                embedder=rig.embedder, emit=rig.events.append, chunks=chunks)
    snapshot = decode_payload(payload)
    assert len(snapshot.chunks) == 3
    loaded.load_snapshot(snapshot, rig.prefix_tokens)
    rig.enter_slot(loaded, 1)
    assert len(chunks.entries_of(loaded.sequence)) == 3
    second = rig.memory("b", 2, chunks=chunks)
    hits = attach(rig, second, [copy_of(b) for b in blocks])
    assert [h["where"] for h in hits] == ["slot", "slot", "ram"]
    assert loaded.sequence.chunk_records() == snapshot.chunks         # written again, it offers the same


def test_a_record_that_does_not_check_out_is_not_registered(rig, chunks):
    first = rig.memory("a", 0, chunks=chunks)
    [rig.add(first, "file", 16) for _ in range(2)]
    first.park()
    snapshot = first.snapshot("prefix", [{"role": "user", "content": "x", "evoke_turn": 1}])
    index, (key, origin) = max(snapshot.chunks.items())
    snapshot.chunks = {**snapshot.chunks, index: (key[::-1], origin)}   # a chain its tokens do not give
    payload = encode_payload(snapshot)
    first.release()
    loaded = ConversationMemory("a", settings=rig.settings, runtime=rig.rt, kv=rig.kv, pool=rig.pool,
                                embedder=rig.embedder, emit=rig.events.append, chunks=chunks)
    loaded.load_snapshot(decode_payload(payload), rig.prefix_tokens)
    assert len(chunks.entries_of(loaded.sequence)) == 1


def reopened(rig: Rig, chunks: ChunkIndex, memory: ConversationMemory, seq: int, *, tamper=None) -> ConversationMemory:
    """`memory` parked, written as a snapshot, released and loaded back into slot `seq` (a reopen from its file)."""
    memory.park()
    snapshot = memory.snapshot("prefix", [{"role": "user", "content": "x", "evoke_turn": 1}])
    if tamper is not None:
        tamper(snapshot)
    payload = encode_payload(snapshot)
    memory.release()
    loaded = ConversationMemory(memory.id, settings=rig.settings, runtime=rig.rt, kv=rig.kv, pool=rig.pool,
                                embedder=rig.embedder, emit=rig.events.append, chunks=chunks)
    loaded.load_snapshot(decode_payload(payload), rig.prefix_tokens)
    rig.enter_slot(loaded, seq)
    return loaded


def test_a_reopened_exact_conversation_stays_exact_and_publishes_what_it_decodes_next(rig, chunks):
    first = rig.memory("a", 0, chunks=chunks)
    rig.add(first, "file", 16)
    loaded = reopened(rig, chunks, first, 1)
    assert loaded.sequence.exact
    later = rig.add(loaded, "file", 16)
    assert any(block is later for _, block, _ in chunks.entries_of(loaded.sequence))


@pytest.mark.parametrize("how", ["moved", "tampered"])
def test_a_reopened_conversation_not_known_exact_publishes_nothing_new(rig, chunks, how):
    first = rig.memory("a", 0, chunks=chunks)
    blocks = [rig.add(first, "file", 16) for _ in range(2)]
    tamper = None
    if how == "moved":
        first.sequence.evict([blocks[0]], keep_bytes=False)         # the later block moved: not a fresh decode
    else:
        def tamper(snapshot):
            index, (key, origin) = max(snapshot.chunks.items())
            snapshot.chunks[index] = (key[::-1], origin)
    loaded = reopened(rig, chunks, first, 1, tamper=tamper)
    assert not loaded.sequence.exact
    later = rig.add(loaded, "file", 16)
    assert not any(block is later for _, block, _ in chunks.entries_of(loaded.sequence))
