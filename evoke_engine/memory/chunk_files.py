"""KV files as a source of chunk reuse: which exact blocks each conversation's KV file holds (from its snapshot when
it is written, from the files' heads when the model loads) and their K/V read back for a splice.

Invariants: bytes are handed out only from a payload the store verified (digest, model) whose head, checked whole,
still records the asked-for chain for that block (for a block of the slot image the chain recomputed from the
file's resident tokens must equal it too) and whose bytes hold each of its positions once; saved bytes are used
only full-width (a packed payload never). One verified payload is kept while its file's version is unchanged, so
the blocks of one attachment cost one read of the file; a rewritten, touched or removed file is read again.
"""

from __future__ import annotations

import json
import logging
import struct
import time
from dataclasses import dataclass
from typing import Any

from ..errors import RestoreError
from ..kvcache.blocks import Block, BlockState
from ..kvcache.chunk_index import ChunkIndex, FileChunk, chain_hash
from ..kvcache.state_cells import UnfitState, cut
from ..runtime.kv import SavedKV
from ..store.kvfiles import KVFileStore
from .snapshot import Snapshot
from .snapshot_check import SnapshotError, check_head, chunks_of, migrate_head

log = logging.getLogger(__name__)

PACKED_PREFIX = b"EVKVQ"          # the host pool's quantized payloads (kvquant.MAGIC and its variants)
MAX_HEAD_BYTES = 64 << 20         # a head larger than this is not catalogued (it is still read when opened)
# A file is read (and its digest checked) whole, once per version: it is worth it for a run of blocks whose K/V
# take at least 1/MAX_READ_RATIO of the file. Reading and hashing a byte costs far less than decoding the token
# it belongs to (CPU: about 1/600; a GPU prefill with a cold disk: 1/5 to 1/20), so 16 keeps a big file for a
# small match (a common first line) off the first token's path and takes a file's attachment from it.
MAX_READ_RATIO = 16


def file_chunks(conversation_id: str, blocks: list[Block] | list[dict], chunks: dict[int, tuple[str, int]],
                sizes: dict[str, tuple[int, int]]) -> list[tuple[str, FileChunk]]:
    """(key, FileChunk) of a snapshot's exact blocks (`Snapshot.chunks`), with blocks as Blocks or head rows;
    `sizes`: bytes and tokens of its blobs ("image", and each saved block's index as a string)."""
    found = []
    for index, (key, origin) in sorted(chunks.items()):
        if not 0 <= index < len(blocks):
            continue
        block = blocks[index]
        if isinstance(block, Block):
            name, n_tokens, resident = block.name, block.n_tokens, block.state is BlockState.RESIDENT
        else:
            name, n_tokens, resident = block["name"], len(block["tokens"]), block["state"] == "resident"
        nbytes, tokens = sizes.get("image" if resident else str(index), (0, 1))
        found.append((key, FileChunk(conversation_id, index, name, origin, n_tokens,
                                     nbytes * n_tokens // max(1, tokens))))
    return found


def _sizes(snapshot: Snapshot) -> dict[str, tuple[int, int]]:
    blobs = {str(index): saved for index, saved in snapshot.saved.items()}
    if snapshot.image is not None:
        blobs["image"] = snapshot.image
    return {key: (len(data), n_tokens) for key, (data, _origin, n_tokens) in blobs.items()}


@dataclass
class _Opened:
    """A verified payload of one file version, its checked head and where each exact block's bytes are."""

    conversation_id: str
    version: tuple
    body: memoryview
    rows: list[dict]
    spans: dict[str, list[int]]
    records: dict[int, tuple[str, int]]
    chains: dict[int, str]          # resident block index -> its chain key recomputed from the file's tokens


class KVFileChunks:
    """The `ChunkFiles` of one model's KV files (the store verifies digests and the model on every read)."""

    def __init__(self, store: KVFileStore) -> None:
        self.store = store
        self._opened: _Opened | None = None
        self.reads = 0                       # verified reads of a whole file (one per file version used)

    # -- the catalogue ------------------------------------------------------------------------
    def catalogue(self, index: ChunkIndex) -> int:
        """Read the head of every unexpired KV file (not its K/V, not its digest: each entry is verified before
        use) and give the index their exact blocks. Returns the number of entries."""
        started, total = time.perf_counter(), 0
        try:
            conversation_ids = self.store.conversations()
        except OSError as exc:                    # a cache folder it cannot list: no file entries, the model loads
            log.warning("chunk index: KV files not catalogued: %s", exc)
            return 0
        for conversation_id in conversation_ids:
            head = self._peek_head(conversation_id)
            if head is None:
                continue
            try:
                sizes = {key: (int(span[1]), int(span[3])) for key, span in head["spans"].items()}
                entries = file_chunks(conversation_id, head["blocks"], chunks_of(head), sizes)
            except (AttributeError, KeyError, TypeError, ValueError, IndexError):     # a head not written by us
                continue
            if entries:
                index.set_file(conversation_id, entries)
                total += len(entries)
        log.info("chunk index: %d blocks of KV files catalogued in %.0f ms", total,
                 1000 * (time.perf_counter() - started))
        return total

    def _peek_head(self, conversation_id: str) -> dict | None:
        raw = self.store.peek(conversation_id, 0, 4)
        if raw is None or len(raw) != 4:
            return None
        (length,) = struct.unpack("<I", raw)
        if length > MAX_HEAD_BYTES:
            return None
        raw = self.store.peek(conversation_id, 4, length)
        try:
            head = migrate_head(json.loads(raw)) if raw is not None and len(raw) == length else None
        except (ValueError, SnapshotError):
            return None
        if not isinstance(head, dict) or head.get("conversation_id") != conversation_id:
            return None
        if not isinstance(head.get("blocks"), list) or not isinstance(head.get("chunks", {}), dict):
            return None
        return head

    def written(self, index: ChunkIndex, snapshot: Snapshot) -> None:
        """The snapshot was just written as its conversation's KV file: its exact blocks replace the file's."""
        self._opened = None
        index.set_file(snapshot.conversation_id,
                       file_chunks(snapshot.conversation_id, snapshot.blocks, snapshot.chunks, _sizes(snapshot)))

    # -- ChunkFiles -----------------------------------------------------------------------------
    def worth(self, chunk: FileChunk, run_bytes: int) -> bool:
        """The file is already read as it is now, or no larger than MAX_READ_RATIO times the run's K/V (a file
        that is gone is worth a look: `holds` then finds it gone and the index forgets it)."""
        version = self.store.version(chunk.conversation_id)
        if version is None or self._opened is not None and self._opened.conversation_id == chunk.conversation_id \
                and self._opened.version == version:
            return True
        return version[2] <= MAX_READ_RATIO * max(1, run_bytes)

    def holds(self, key: str, chunk: FileChunk) -> bool:
        try:
            opened = self._open(chunk.conversation_id)
            return opened is not None and self._span(opened, key, chunk) is not None
        except Exception:  # noqa: BLE001 - a file that passed the store's checks yet breaks here is a bug to log;
            log.exception("KV file of %s not used for chunk reuse", chunk.conversation_id)   # still only a cache
            self._opened = None
            return False

    def read(self, key: str, chunk: FileChunk) -> SavedKV:
        opened = self._open(chunk.conversation_id)
        span = None if opened is None else self._span(opened, key, chunk)
        if span is None:
            raise RestoreError(f"the KV file of {chunk.conversation_id} no longer holds {chunk.name}")
        offset, length = span
        try:
            data = cut(opened.body[offset:offset + length], chunk.origin, chunk.origin + chunk.n_tokens)
        except UnfitState as exc:
            raise RestoreError(f"the KV file of {chunk.conversation_id}: {chunk.name} does not fit ({exc})") from exc
        return SavedKV(data, chunk.origin, chunk.n_tokens)

    def close(self) -> None:
        self._opened = None

    # -- reading ------------------------------------------------------------------------------
    def _open(self, conversation_id: str) -> _Opened | None:
        """The verified payload of the conversation's file as it is now (kept while its version holds)."""
        version = self.store.version(conversation_id)
        if version is None:
            self._opened = None
            return None
        if self._opened is not None and self._opened.conversation_id == conversation_id \
                and self._opened.version == version:
            return self._opened
        self._opened = None
        payload = self.store.read(conversation_id, refresh=False)
        if payload is None:
            return None
        self.reads += 1
        try:
            opened = _parse(conversation_id, version, payload)
        except SnapshotError as exc:
            log.warning("KV file of %s not used for chunk reuse: %s", conversation_id, exc)
            return None
        self._opened = opened
        return opened

    @staticmethod
    def _span(opened: _Opened, key: str, chunk: FileChunk) -> tuple[int, int] | None:
        """(offset, length) in the body of the bytes holding `chunk` with chain `key`, or None when the file
        does not record exactly that."""
        index = chunk.block_index
        if not 0 <= index < len(opened.rows) or opened.records.get(index) != (key, chunk.origin):
            return None
        row = opened.rows[index]
        if row["name"] != chunk.name or len(row["tokens"]) != chunk.n_tokens:
            return None
        if row["state"] == BlockState.RESIDENT.value:
            span = opened.spans.get("image")
            if opened.chains.get(index) != key or span is None:
                return None
            offset, length, origin, n_tokens = span
            if not (origin <= chunk.origin and chunk.origin + chunk.n_tokens <= origin + n_tokens):
                return None
        else:
            span = opened.spans.get(str(index))
            if span is None or span[2] != chunk.origin or span[3] != chunk.n_tokens:
                return None
            offset, length = span[0], span[1]
        if bytes(opened.body[offset:offset + len(PACKED_PREFIX)]) == PACKED_PREFIX:
            return None                                     # packed: near, not exact
        return offset, length


def _parse(conversation_id: str, version: tuple, payload: Any) -> _Opened:
    """The checked head of a verified payload (SnapshotError when it is not a usable snapshot of the conversation)."""
    try:
        (length,) = struct.unpack_from("<I", payload, 0)
        if 4 + length > len(payload):
            raise SnapshotError("head longer than the payload")
        head = json.loads(bytes(payload[4:4 + length]))
    except (struct.error, ValueError) as exc:
        raise SnapshotError(f"unreadable snapshot head: {exc}") from exc
    head = migrate_head(head)
    body = memoryview(payload)[4 + length:]
    check_head(head, len(body))
    if head["conversation_id"] != conversation_id:
        raise SnapshotError("written for another conversation")
    rows = head["blocks"]
    chains, key = {}, ""
    resident = sorted((i for i, r in enumerate(rows) if r["state"] == BlockState.RESIDENT.value),
                      key=lambda i: rows[i]["pos"])
    for i in resident:
        key = chain_hash(key, rows[i]["tokens"])
        chains[i] = key
    return _Opened(conversation_id, version, body, rows, head["spans"], chunks_of(head), chains)

