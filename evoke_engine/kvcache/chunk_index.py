"""The index of decoded chunks across conversations: prefix hash -> where a block's exact K/V still live, and
content hash (the block's tokens alone) -> the same entries, for approximate (re-anchored, repaired) reuse.

Invariants: a key is the hash chain over the token ids of everything before a block and the block itself (from
position 0, the shared prefix included), so an entry holds K/V a fresh decode at those positions would give; an
entry is registered only by `ResidentSequence` while its cells are exact; `lookup` hands out an entry only after
checking it is still true (the block still in its owner's slot at its origin position, or its full-width bytes
in the pool at that origin) and forgets stale ones (a parked owner's stay, unused): a stale entry is never used.
Closed conversations leave file entries (`FileChunk`: a block of a KV file), used only for an exact match no open
conversation holds, and only after `files` (the KV files' reader, `ChunkFiles`) verified the file still records
that chain there. A lookup given an `owner` considers only entries of conversations `owner_of` gives that owner
(the endpoint's clients and the window are owners apart, issue 42: reuse across them is a membership oracle). It
moves no bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..runtime.kv import SavedKV
from .blocks import Block, BlockState, BlockTable
from .pool import SavedPool


def chain_hash(previous: str, tokens: list[int]) -> str:
    """The prefix hash of a block: `previous` (the chain before it, "" at position 0) and its token ids."""
    digest = hashlib.sha256(previous.encode())
    digest.update(np.asarray(tokens, dtype=np.int32).tobytes())
    return digest.hexdigest()[:32]


def chain_of(blocks: Iterable[Block]) -> str:
    """The chain hash after `blocks` (in position order), "" for none."""
    key = ""
    for block in blocks:
        key = chain_hash(key, block.tokens)
    return key


class ChunkOwner(Protocol):
    """What the index reads of a sequence (`ResidentSequence`): its slot, table and pool."""

    label: str
    seq: int | None
    table: BlockTable
    pool: SavedPool


@dataclass(frozen=True)
class FileChunk:
    """Block `block_index` (named `name`) of conversation `conversation_id`'s KV file holds the exact K/V of its
    chain at [origin, origin + n_tokens): in the file's slot image, or as the block's saved bytes."""

    conversation_id: str
    block_index: int
    name: str
    origin: int
    n_tokens: int
    nbytes: int = 0          # about what its K/V take in the file (what reading it is weighed against)


class ChunkFiles(Protocol):
    """What the index asks of the KV files (memory.chunk_files.KVFileChunks)."""

    def worth(self, chunk: FileChunk, run_bytes: int) -> bool:
        """Reading `chunk`'s file now is worth it for a run of `run_bytes` of K/V spliced from it (the file is
        read and verified whole, once per version)."""
        ...

    def holds(self, key: str, chunk: FileChunk) -> bool:
        """The file is there, intact, and still records chain `key` for `chunk` with bytes that can be spliced."""
        ...

    def read(self, key: str, chunk: FileChunk) -> SavedKV:
        """The exact K/V of `chunk` as `KVCache.save` gives them; RestoreError when the file no longer has them."""
        ...


@dataclass(frozen=True)
class ChunkSource:
    """Where a match's K/V are: `where` is "slot" (cells of `owner.seq` at [origin, origin + n_tokens)), "ram"/
    "disk" (the pool's bytes of `block`, saved at `origin`) or "file" (`file`, a closed conversation's KV file;
    no `owner` nor `block` then); `exact`: a prefix-hash match (else the same tokens after another prefix: a
    content-hash match)."""

    key: str
    owner: ChunkOwner | None
    block: Block | None
    origin: int
    n_tokens: int
    where: str
    exact: bool = True
    file: FileChunk | None = None

    @property
    def label(self) -> str:
        """The conversation the K/V come from."""
        return self.file.conversation_id if self.file is not None else self.owner.label

    @property
    def block_name(self) -> str:
        return self.file.name if self.file is not None else self.block.name


@dataclass(frozen=True)
class _Entry:
    owner: ChunkOwner
    block: Block
    origin: int
    n_tokens: int


class ChunkIndex:
    """Prefix hash -> blocks (of any open conversation) whose cells or saved bytes hold that chunk exactly, and
    blocks of KV files that do."""

    def __init__(self, files: ChunkFiles | None = None) -> None:
        self._entries: dict[str, list[_Entry]] = {}
        self._by_content: dict[str, set[str]] = {}     # content hash -> the prefix hashes holding those tokens
        self._in_files: dict[str, list[FileChunk]] = {}    # prefix hash -> blocks of KV files holding it
        self.files = files                                 # the KV files' reader (None: no file entries used)
        self.owner_of: Callable[[str], str] = lambda _label: ""    # a conversation id -> its owner (set by the
                                                                    # conversations' lifecycle: SQLite knows)
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._entries.values())

    def register(self, key: str, owner: ChunkOwner, block: Block, origin: int | None = None) -> None:
        """`block` of `owner`, resident at its position (or saved in the pool at `origin`, when given), holds the
        exact K/V of chain `key`."""
        origin = block.pos if origin is None else origin
        if origin is None:
            return
        entries = self._entries.setdefault(key, [])
        entries[:] = [e for e in entries if e.block is not block]
        entries.append(_Entry(owner, block, origin, block.n_tokens))
        self._by_content.setdefault(block.hash, set()).add(key)

    def entries_of(self, owner: ChunkOwner) -> list[tuple[str, Block, int]]:
        """(key, block, origin) of `owner`'s entries that are still true (in its slot, parked image or pool)."""
        return [(key, e.block, e.origin) for key, entries in self._entries.items() for e in entries
                if e.owner is owner and _where(e) is not None]

    # -- KV files ---------------------------------------------------------------------------
    def set_file(self, conversation_id: str, chunks: Iterable[tuple[str, FileChunk]]) -> None:
        """The conversation's KV file (just written, or found at start) holds `chunks` (key, chunk): they
        replace whatever the index knew of its file."""
        self.forget_file(conversation_id)
        for key, chunk in chunks:
            if chunk.conversation_id != conversation_id:
                raise ValueError(f"a chunk of {chunk.conversation_id} given for {conversation_id}")
            self._in_files.setdefault(key, []).append(chunk)

    def forget_file(self, conversation_id: str) -> None:
        """The conversation's KV file is gone or changed: none of its entries is used."""
        for key in list(self._in_files):
            kept = [c for c in self._in_files[key] if c.conversation_id != conversation_id]
            if kept:
                self._in_files[key] = kept
            else:
                del self._in_files[key]

    def file_entries(self, conversation_id: str | None = None) -> int:
        """How many file entries the index holds (of `conversation_id`'s file only, when given)."""
        return sum(1 for chunks in self._in_files.values() for c in chunks
                   if conversation_id is None or c.conversation_id == conversation_id)

    def _in_file(self, key: str, exclude: str | None, following: Iterable[str],
                 owner: str | None = None) -> ChunkSource | None:
        """A file entry of `key` (not of conversation `exclude`; of a conversation of `owner` only, when given)
        worth reading for the run it starts (this block and those of `following`, the keys of the blocks after it,
        the same file holds; computed only as far as needed) and that `files` verified; files that fail
        verification go."""
        candidates = [c for c in self._in_files.get(key, ()) if c.conversation_id != exclude
                      and (owner is None or self.owner_of(c.conversation_id) == owner)]
        if self.files is None or not candidates:
            return None
        keys: list[str] = []
        later_keys = iter(following)
        for chunk in candidates:
            run = chunk.nbytes
            for at in itertools.count():
                if at == len(keys):
                    later = next(later_keys, None)
                    if later is None:
                        break
                    keys.append(later)
                same = [c for c in self._in_files.get(keys[at], ()) if c.conversation_id == chunk.conversation_id]
                if not same:
                    break
                run += same[0].nbytes
            if not self.files.worth(chunk, run):
                continue
            if self.files.holds(key, chunk):
                return ChunkSource(key, None, None, chunk.origin, chunk.n_tokens, "file", file=chunk)
            self.forget_file(chunk.conversation_id)
        return None

    def keys_of(self, owner: ChunkOwner) -> list[str]:
        return [key for key, entries in self._entries.items() if any(e.owner is owner for e in entries)]

    def forget(self, owner: ChunkOwner, blocks: Iterable[Block] | None = None) -> None:
        """Drop the entries of `owner` (of `blocks` only, when given): its cells or bytes are going away."""
        doomed = None if blocks is None else set(blocks)     # blocks hash by identity
        for key in list(self._entries):
            kept = [e for e in self._entries[key]
                    if e.owner is not owner or (doomed is not None and e.block not in doomed)]
            if kept:
                self._entries[key] = kept
            else:
                del self._entries[key]
        for content, keys in list(self._by_content.items()):
            keys.intersection_update(self._entries)
            if not keys:
                del self._by_content[content]

    def lookup_content(self, content: str, *, exclude: ChunkOwner | None = None,
                       prefer: ChunkOwner | None = None, owner: str | None = None) -> ChunkSource | None:
        """A still-true source of a block with content hash `content` after any prefix (approximate), `prefer`'s
        when it holds one (a run spliced from one slot has one seam), of a conversation of `owner` only when given;
        or None."""
        found = [f for key in sorted(self._by_content.get(content, ()))
                 if (f := self.lookup(key, exclude=exclude, files=False, owner=owner)) is not None]
        if not found:
            return None
        best = next((f for f in found if f.owner is prefer), found[0])
        return dataclasses.replace(best, exact=False)

    def lookup(self, key: str, *, exclude: ChunkOwner | None = None, files: bool = True,
               following: Iterable[str] = (), owner: str | None = None) -> ChunkSource | None:
        """A still-true source of chain `key` (not of `exclude`; of a conversation of `owner` only, when given),
        preferring cells in a slot, then the pool, then (with `files`) a verified KV file worth reading for the run
        from `key` on (`following`: the keys of the blocks meant to come next); stale entries go."""
        entries = self._entries.get(key, [])
        live = [e for e in entries if _where(e) is not None]
        if len(live) != len(entries):
            if live:
                self._entries[key] = live
            else:
                self._entries.pop(key, None)
        found = sorted((e for e in live if e.owner is not exclude and _where(e) != "parked"
                        and (owner is None or self.owner_of(e.owner.label) == owner)),
                       key=lambda e: _where(e) != "slot")
        if not found:
            in_file = self._in_file(key, exclude.label if exclude is not None else None, following, owner) \
                if files else None
            if in_file is None:
                self.misses += 1
            else:
                self.hits += 1
            return in_file
        self.hits += 1
        entry = found[0]
        return ChunkSource(key, entry.owner, entry.block, entry.origin, entry.n_tokens, _where(entry))


def _where(entry: _Entry) -> str | None:
    """Where the entry's exact K/V are now ("slot", "ram", "disk"; "parked": in its owner's slot image, not
    usable until it is back in a slot), or None when they are not any more."""
    owner, block = entry.owner, entry.block
    if block.n_tokens != entry.n_tokens or not any(b is block for b in owner.table.blocks):
        return None
    if block.state is BlockState.RESIDENT:
        if block.pos != entry.origin:
            return None                              # moved: K re-rotated, near but not equal
        return "slot" if owner.seq is not None else "parked"
    if block.state in (BlockState.RAM, BlockState.DISK) and owner.pool.holds_exact(block, entry.origin):
        return block.state.value
    return None
