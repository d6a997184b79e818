"""Named blocks of a conversation and the table that places resident ones in the sequence.

Invariants: resident blocks occupy contiguous positions [0, active_tokens) in table order
(`BlockTable.check`); a block is in exactly one state; a shared (prefix) block is never
moved or evicted; content hashes are set once, from the block's token ids; a block whose cells a
forked sibling conversation may also hold (`sibling_shared`) is copied out before its cells move.
Blocks compare and hash by identity (dict keys and set members as they are). Only `resident.ResidentSequence`
calls the table's mutators of lists, positions and states, keeping the table equal to the slot's cells.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InvariantError


class BlockState(enum.Enum):
    RESIDENT = "resident"     # in the context, attended to
    RAM = "ram"               # K/V bytes in the host pool
    DISK = "disk"             # K/V bytes spilled to a file
    DROPPED = "dropped"       # gone; only the text remains (history)


def content_hash(tokens: list[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype=np.int32).tobytes()).hexdigest()[:16]


@dataclass(eq=False)                 # identity equality and hash: a block is a dict key itself
class Block:
    name: str                 # system, tools, user#3, user#3.1, assistant#3, file:notes.txt#2
    role: str                 # system | tools | user | assistant | file | breadcrumb
    turn: int
    tokens: list[int]
    text: str
    state: BlockState = BlockState.RESIDENT
    pos: int | None = None    # first position while resident
    shared: bool = False      # cells shared with a prefix sequence
    sibling_shared: bool = False  # cells possibly shared with a forked conversation's sequence
    pinned: bool = False
    priority: float = 1.0
    file_name: str | None = None
    embedding: np.ndarray | None = None
    hash: str = field(default="")
    recoveries: int = 0
    reused_from: str | None = None   # "<conversation>:<block> (slot|ram|disk|file, exact)" when spliced from another

    def __post_init__(self) -> None:
        if not self.hash:
            self.hash = content_hash(self.tokens)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def end(self) -> int:
        if self.pos is None:
            raise InvariantError(f"{self.name} is not resident")
        return self.pos + self.n_tokens

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "role": self.role, "state": self.state.value,
                "tokens": self.n_tokens, "pos": self.pos, "turn": self.turn,
                "pinned": self.pinned, "shared": self.shared, "sibling_shared": self.sibling_shared,
                "recoveries": self.recoveries, "reused_from": self.reused_from, "file_name": self.file_name}

    def message_key(self) -> tuple[int, str]:
        """Which message of the history this block belongs to: (turn, "input" | "reply")."""
        return self.turn, "reply" if self.role == "assistant" else "input"

    def clone(self) -> Block:
        """The same block for a forked conversation (same tokens, text, embedding and state)."""
        return dataclasses.replace(self)


class BlockTable:
    """All blocks of a conversation (birth order) and the resident ones (position order).

    The one place that moves blocks between lists, positions and states, at its owner's
    (`ResidentSequence`) command: RAM/DISK/DROPPED as the pool reports where the bytes are.
    """

    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self.resident: list[Block] = []

    @classmethod
    def from_blocks(cls, blocks: list[Block]) -> BlockTable:
        """A table of `blocks` (birth order): resident ones keep their positions, the others have none."""
        table = cls()
        table.blocks = list(blocks)
        table.resident = sorted((b for b in table.blocks if b.state is BlockState.RESIDENT), key=lambda b: b.pos)
        for block in table.blocks:
            if block.state is not BlockState.RESIDENT:
                block.pos = None
        table.check()
        return table

    @property
    def active_tokens(self) -> int:
        """Tokens in the context: the end of the last resident block (they are contiguous from 0, `check`); O(1),
        read several times a token while a reply grows."""
        if not self.resident:
            return 0
        last = self.resident[-1]
        return last.pos + len(last.tokens)

    def by_name(self, name: str) -> Block | None:
        return next((b for b in self.blocks if b.name == name), None)

    def append(self, block: Block) -> Block:
        """A newly decoded block at the tail."""
        self.blocks.append(block)
        self.place_at_tail(block)
        return block

    def place_at_tail(self, block: Block) -> None:
        block.pos = self.active_tokens
        block.state = BlockState.RESIDENT
        self.resident.append(block)

    def split(self, block: Block, pieces: list[Block]) -> None:
        """Replace resident `block` by `pieces` (its tokens, in order) at the same positions."""
        if [t for piece in pieces for t in piece.tokens] != block.tokens:
            raise InvariantError(f"the pieces of {block.name} do not hold its tokens")
        start = block.pos
        at_all, at_resident = self.blocks.index(block), self.resident.index(block)
        self.blocks[at_all:at_all + 1] = pieces
        self.resident[at_resident:at_resident + 1] = pieces
        for piece in pieces:
            piece.pos, piece.state = start, BlockState.RESIDENT
            start += piece.n_tokens

    def remove_resident(self, block: Block, new_state: BlockState) -> tuple[int, int]:
        """Take `block` out of the resident run; later blocks move down. Returns its old range."""
        if block.shared:
            raise InvariantError(f"shared block {block.name} cannot leave the context")
        index = self.resident.index(block)
        p0, p1 = block.pos, block.end
        del self.resident[index]
        for later in self.resident[index:]:
            later.pos -= block.n_tokens
        block.pos = None
        block.state = new_state
        return p0, p1

    def forget(self, block: Block) -> None:
        """Remove a non-resident block from the conversation for good (its message is gone)."""
        if block.state is BlockState.RESIDENT:
            raise ValueError(f"{block.name} is resident: take it out of the context first")
        block.state = BlockState.DROPPED
        self.blocks.remove(block)

    def mark_bytes(self, block: Block, where: BlockState) -> None:
        """A block out of the context whose K/V bytes are now `where`: RAM, DISK, or DROPPED (gone; only
        its text remains)."""
        if block.state is BlockState.RESIDENT or where is BlockState.RESIDENT:
            raise InvariantError(f"{block.name}: only a block out of the context has its bytes elsewhere")
        block.state = where

    def mark_private(self, from_pos: int = 0) -> None:
        """Resident blocks at and after `from_pos` hold cells no forked sibling shares any more."""
        for block in self.resident:
            if block.pos >= from_pos:
                block.sibling_shared = False

    def mark_sibling_shared(self) -> None:
        """Every resident block outside the prefix now shares its cells with a forked sibling."""
        for block in self.resident:
            if not block.shared:
                block.sibling_shared = True

    def pin(self, name: str, pinned: bool = True, priority: float | None = None) -> None:
        """Pin a block (never evicted) or change its priority multiplier."""
        block = self.by_name(name)
        if block is None:
            raise KeyError(f"no block {name!r} in this conversation")
        block.pinned = pinned
        if priority is not None:
            block.priority = priority

    def saved(self) -> list[Block]:
        return [b for b in self.blocks if b.state in (BlockState.RAM, BlockState.DISK)]

    def check(self) -> None:
        pos = 0
        for block in self.resident:
            if block.state is not BlockState.RESIDENT:
                raise InvariantError(f"{block.name} is in the resident run but {block.state.value}")
            if block.pos != pos:
                raise InvariantError(f"{block.name} at {block.pos}, expected {pos}")
            pos += block.n_tokens
        for block in self.blocks:
            if block.state is not BlockState.RESIDENT and (block.pos is not None or block in self.resident):
                raise InvariantError(f"{block.name} is {block.state.value} but still has a position")
