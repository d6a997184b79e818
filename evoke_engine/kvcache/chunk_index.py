"""The index of decoded chunks across conversations: prefix hash -> where a block's exact K/V still live, and
content hash (the block's tokens alone) -> the same entries, for approximate (re-anchored, repaired) reuse.

Invariants: a key is the hash chain over the token ids of everything before a block and the block itself (from
position 0, the shared prefix included), so an entry holds K/V a fresh decode at those positions would give; an
entry is registered only by `ResidentSequence` while its cells are exact; `lookup` hands out an entry only after
checking it is still true (the block still in its owner's slot at its origin position, or its full-width bytes
in the pool at that origin) and forgets stale ones (a parked owner's stay, unused): a stale entry is never used.
It moves no bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

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
class ChunkSource:
    """Where a match's K/V are: `where` is "slot" (cells of `owner.seq` at [origin, origin + n_tokens)) or
    "ram"/"disk" (the pool's bytes of `block`, saved at `origin`); `exact`: a prefix-hash match (else the same
    tokens after another prefix: a content-hash match)."""

    key: str
    owner: ChunkOwner
    block: Block
    origin: int
    n_tokens: int
    where: str
    exact: bool = True


@dataclass(frozen=True)
class _Entry:
    owner: ChunkOwner
    block: Block
    origin: int
    n_tokens: int


class ChunkIndex:
    """Prefix hash -> blocks (of any open conversation) whose cells or saved bytes hold that chunk exactly."""

    def __init__(self) -> None:
        self._entries: dict[str, list[_Entry]] = {}
        self._by_content: dict[str, set[str]] = {}     # content hash -> the prefix hashes holding those tokens
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._entries.values())

    def register(self, key: str, owner: ChunkOwner, block: Block) -> None:
        """`block` of `owner`, resident at its position, holds the exact K/V of chain `key`."""
        if block.pos is None:
            return
        entries = self._entries.setdefault(key, [])
        entries[:] = [e for e in entries if e.block is not block]
        entries.append(_Entry(owner, block, block.pos, block.n_tokens))
        self._by_content.setdefault(block.hash, set()).add(key)

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
                       prefer: ChunkOwner | None = None) -> ChunkSource | None:
        """A still-true source of a block with content hash `content` after any prefix (approximate), `prefer`'s
        when it holds one (a run spliced from one slot has one seam), or None."""
        found = [f for key in sorted(self._by_content.get(content, ()))
                 if (f := self.lookup(key, exclude=exclude)) is not None]
        if not found:
            return None
        best = next((f for f in found if f.owner is prefer), found[0])
        return dataclasses.replace(best, exact=False)

    def lookup(self, key: str, *, exclude: ChunkOwner | None = None) -> ChunkSource | None:
        """A still-true source of chain `key` (not of `exclude`), preferring cells in a slot; stale entries go."""
        entries = self._entries.get(key, [])
        live = [e for e in entries if _where(e) is not None]
        if len(live) != len(entries):
            if live:
                self._entries[key] = live
            else:
                self._entries.pop(key, None)
        found = sorted((e for e in live if e.owner is not exclude and _where(e) != "parked"),
                       key=lambda e: _where(e) != "slot")
        if not found:
            self.misses += 1
            return None
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
