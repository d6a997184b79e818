"""KV files as a chunk reuse source, on a real KV file store with synthetic snapshots: the heads are catalogued,
a block comes back as the cut of the image (or its full-width saved bytes), one verified read serves a file
version, and a file whose head no longer records the chain, whose bytes are packed, or which is gone, damaged or
replaced is not used."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from helpers.state_blobs import N_LAYER, WIDTH, state_blob, tensors

from evoke_engine.errors import RestoreError
from evoke_engine.kvcache import kvquant
from evoke_engine.kvcache.blocks import Block, BlockState
from evoke_engine.kvcache.chunk_index import ChunkIndex, FileChunk, chain_hash
from evoke_engine.kvcache.state_cells import cut
from evoke_engine.memory import chunk_files
from evoke_engine.memory.chunk_files import KVFileChunks, file_chunks
from evoke_engine.memory.snapshot import Snapshot, SnapshotError, decode_payload, encode_payload
from evoke_engine.store.kvfiles import KVFileStore

pytestmark = pytest.mark.unit

PREFIX = list(range(1, 11))                       # 10 shared tokens at positions 0..9
FIRST, SECOND, SAVED = list(range(100, 116)), list(range(200, 216)), list(range(300, 316))


def f16_tensors(n_cells: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return tuple(rng.normal(0, 1, (N_LAYER, n_cells, WIDTH)).astype("<f2").view(np.uint8) for _ in range(2))


def snapshot(conversation_id: str = "a", *, packed_saved: bool = False) -> tuple[Snapshot, dict[str, str]]:
    """Prefix, two resident file blocks (in the image at 10..41, cells out of order) and one saved block (origin
    42): every file block recorded exact with its chain key."""
    blocks = [Block(name="system", role="system", turn=0, tokens=PREFIX, text="", shared=True, pos=0),
              Block(name="file:x#0", role="file", turn=1, tokens=FIRST, text="", pos=10),
              Block(name="file:x#1", role="file", turn=1, tokens=SECOND, text="", pos=26),
              Block(name="file:x#2", role="file", turn=1, tokens=SAVED, text="", state=BlockState.RAM)]
    positions = list(np.random.default_rng(0).permutation(np.arange(10, 42)))
    k, v = tensors(32, seed=1)
    image = state_blob([int(p) for p in positions], k, v, v_trans=True)
    saved = state_blob(list(range(42, 58)), *f16_tensors(16, seed=2), v_trans=False)
    if packed_saved:
        saved = kvquant.pack(saved)
    keys = {"first": chain_hash(chain_hash("", PREFIX), FIRST)}
    keys["second"] = chain_hash(keys["first"], SECOND)
    keys["saved"] = chain_hash(keys["second"], SAVED)          # saved before anything moved
    shot = Snapshot(conversation_id=conversation_id, prefix_key="p", turn=1, budget_tokens=1024,
                    history=[{"role": "user", "content": "x"}], blocks=blocks, image=(image, 10, 32),
                    saved={3: (saved, 42, 16)},
                    chunks={1: (keys["first"], 10), 2: (keys["second"], 26), 3: (keys["saved"], 42)})
    return shot, keys


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path, clock) -> KVFileStore:
    return KVFileStore(tmp_path, "0123456789abcdef", clock=clock)


def catalogued(store: KVFileStore) -> tuple[ChunkIndex, KVFileChunks]:
    files = KVFileChunks(store)
    index = ChunkIndex(files=files)
    files.catalogue(index)
    return index, files


def test_the_heads_are_catalogued_and_blocks_come_back_as_the_image_cut_and_the_saved_bytes(store):
    shot, keys = snapshot()
    store.write("a", "long", encode_payload(shot))
    unrecorded, _ = snapshot("empty")
    unrecorded.chunks = {}                                         # a conversation whose cells were not exact
    store.write("empty", "long", encode_payload(unrecorded))
    index, files = catalogued(store)
    assert index.file_entries() == 3
    first = index.lookup(keys["first"])
    assert (first.where, first.label, first.block_name, first.origin) == ("file", "a", "file:x#0", 10)
    assert files.read(first.key, first.file).data == cut(shot.image[0], 10, 26)
    second = index.lookup(keys["second"])
    assert files.read(second.key, second.file).data == cut(shot.image[0], 26, 42)
    saved = index.lookup(keys["saved"])
    got = files.read(saved.key, saved.file)
    assert (bytes(got.data), got.origin_pos, got.n_tokens) == (bytes(shot.saved[3][0]), 42, 16)
    assert files.reads == 1                                        # one verified read of the file for all three


def test_a_touched_or_rewritten_file_is_read_again(store, clock):
    shot, keys = snapshot()
    store.write("a", "long", encode_payload(shot))
    index, files = catalogued(store)
    assert index.lookup(keys["first"]) is not None and files.reads == 1
    clock.now += 60
    assert store.touch("a")                                        # a new mtime: another version of the file
    assert index.lookup(keys["second"]) is not None and files.reads == 2
    store.write("a", "long", encode_payload(shot))
    assert index.lookup(keys["saved"]) is not None and files.reads == 3


@pytest.mark.parametrize("change", ["removed", "damaged", "not recorded", "other tokens", "another conversation"])
def test_a_file_that_no_longer_holds_the_chain_is_not_used_and_forgotten(store, change):
    shot, keys = snapshot()
    store.write("a", "long", encode_payload(shot))
    index, files = catalogued(store)
    if change == "removed":
        store.remove("a")
    elif change == "damaged":
        path = next(store.directory.glob("a.*.bin"))
        data = bytearray(path.read_bytes())
        data[-7] ^= 1
        path.write_bytes(bytes(data))
    elif change == "not recorded":
        shot.chunks = {}
        store.write("a", "long", encode_payload(shot))
    elif change == "other tokens":                                 # the head still says the old chains
        shot.blocks[1] = Block(name="file:x#0", role="file", turn=1, tokens=[t + 1 for t in FIRST], text="", pos=10)
        shot.chunks = {1: shot.chunks[1], 2: shot.chunks[2]}
        store.write("a", "long", encode_payload(shot))
    else:
        store.write("a", "long", encode_payload(snapshot("b")[0]))
    assert index.lookup(keys["first"]) is None
    assert index.file_entries() == 0


def test_packed_saved_bytes_are_never_handed_out_as_exact(store):
    shot, keys = snapshot(packed_saved=True)
    store.write("a", "long", encode_payload(shot))
    index, files = catalogued(store)
    saved = FileChunk("a", 3, "file:x#2", 42, 16)
    assert not files.holds(keys["saved"], saved)
    with pytest.raises(RestoreError):
        files.read(keys["saved"], saved)
    assert index.lookup(keys["first"]) is not None                # the image's blocks still are


def test_a_head_that_is_not_a_snapshot_is_not_catalogued(store):
    store.write("junk", "long", b"\x05\x00\x00\x00{}xyz")
    store.write("short", "long", b"\x01")
    index, _ = catalogued(store)
    assert index.file_entries() == 0


@pytest.mark.parametrize("chunks, reason", [
    ({"9": ["0" * 32, 10]}, "names no block"),
    ({"1": ["not a key", 10]}, "not \\[chain key, origin\\]"),
    ({"1": ["0" * 32, 11]}, "its block at 10"),
    ({"3": ["0" * 32, 40]}, "no saved bytes at origin 40"),
    ([], "not an object"),
])
def test_a_head_whose_chunk_records_do_not_fit_its_table_is_refused(chunks, reason):
    payload = bytearray(encode_payload(snapshot()[0]))
    (length,) = struct.unpack_from("<I", payload)
    head = json.loads(payload[4:4 + length])
    head["chunks"] = chunks
    raw = json.dumps(head).encode()
    with pytest.raises(SnapshotError, match=reason):
        decode_payload(struct.pack("<I", len(raw)) + raw + payload[4 + length:])


@pytest.mark.parametrize("opening", [1, -1, "2", None])
def test_a_head_whose_held_opening_is_not_a_count_of_its_tokens_held_ahead_is_refused(opening):
    payload = bytearray(encode_payload(snapshot()[0]))
    (length,) = struct.unpack_from("<I", payload)
    head = json.loads(payload[4:4 + length])
    assert head["ahead"] == [] and head["ahead_opening"] == 0
    head["ahead_opening"] = opening
    raw = json.dumps(head).encode()
    with pytest.raises(SnapshotError, match="ahead_opening"):
        decode_payload(struct.pack("<I", len(raw)) + raw + payload[4 + length:])
    del head["ahead_opening"]                                      # written before openings moved: none moves
    raw = json.dumps(head).encode()
    assert decode_payload(struct.pack("<I", len(raw)) + raw + payload[4 + length:]).ahead_opening == 0


def test_a_head_without_chunk_records_reads_as_none():
    payload = bytearray(encode_payload(snapshot()[0]))
    (length,) = struct.unpack_from("<I", payload)
    head = json.loads(payload[4:4 + length])
    del head["chunks"]                                             # written before KV files were a reuse source
    raw = json.dumps(head).encode()
    assert decode_payload(struct.pack("<I", len(raw)) + raw + payload[4 + length:]).chunks == {}


def test_a_file_is_read_only_for_a_run_worth_reading_it_for(store, monkeypatch):
    shot, keys = snapshot()
    store.write("a", "long", encode_payload(shot))
    entries = dict(file_chunks("a", shot.blocks, shot.chunks, chunk_files._sizes(shot)))
    whole_run = sum(chunk.nbytes for chunk in entries.values())
    size = store.version("a")[2]
    monkeypatch.setattr(chunk_files, "MAX_READ_RATIO", size / whole_run * 1.01)
    index, files = catalogued(store)
    assert index.lookup(keys["first"]) is None                    # one block: not worth reading the whole file
    assert files.reads == 0 and index.file_entries() == 3         # nothing read, nothing forgotten
    assert index.lookup(keys["first"], following=[keys["second"], "elsewhere", keys["saved"]]) is None
    found = index.lookup(keys["first"], following=[keys["second"], keys["saved"]])    # the run of all three
    assert found is not None and files.reads == 1
    assert index.lookup(keys["second"]) is not None and files.reads == 1   # read already: any block is worth it


def test_a_head_of_odd_shapes_is_skipped_by_the_catalogue(store):
    for name, head in [("spans", {"format": 3, "conversation_id": "spans", "blocks": [], "spans": [], "chunks": {}}),
                       ("rows", {"format": 3, "conversation_id": "rows", "blocks": [7], "spans": {},
                                 "chunks": {"0": ["0" * 32, 1]}}),
                       ("records", {"format": 3, "conversation_id": "records", "blocks": [], "spans": {},
                                    "chunks": {"x": 5}})]:
        raw = json.dumps(head).encode()
        store.write(name, "long", struct.pack("<I", len(raw)) + raw)
    shot, _ = snapshot()
    store.write("a", "long", encode_payload(shot))
    index, _ = catalogued(store)
    assert index.file_entries() == 3                               # only the good file's blocks
