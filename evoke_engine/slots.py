"""Which conversation holds which llama.cpp sequence (slot), and which shared prefix sequences exist.

Invariants: a slot holds at most one conversation; a conversation holds at most one slot;
`release` order is least recently used first; prefix keys are hashes of the prefix tokens.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np


class SlotRegistry:
    def __init__(self, n_slots: int) -> None:
        self.n_slots = n_slots
        self._holder: dict[int, str] = {}                   # slot -> conversation id
        self._lru: OrderedDict[str, int] = OrderedDict()    # conversation id -> slot, oldest first
        self.load: dict[int, int] = dict.fromkeys(range(n_slots), 0)   # conversations served per slot

    def slot_of(self, conversation_id: str) -> int | None:
        return self._lru.get(conversation_id)

    def touch(self, conversation_id: str) -> None:
        if conversation_id in self._lru:
            self._lru.move_to_end(conversation_id)

    def free_slot(self) -> int | None:
        free = [s for s in range(self.n_slots) if s not in self._holder]
        return min(free, key=lambda s: (self.load[s], s)) if free else None

    def least_recent(self, exclude: str | None = None) -> str | None:
        return next((c for c in self._lru if c != exclude), None)

    def pin(self, conversation_id: str, slot: int) -> None:
        assert slot not in self._holder, f"slot {slot} is held by {self._holder[slot]}"
        assert conversation_id not in self._lru, f"{conversation_id} already holds a slot"
        self._holder[slot] = conversation_id
        self._lru[conversation_id] = slot
        self.load[slot] += 1

    def release(self, conversation_id: str) -> int:
        slot = self._lru.pop(conversation_id)
        del self._holder[slot]
        return slot

    def holders(self) -> dict[int, str]:
        return dict(self._holder)


def prefix_key(tokens: list[int]) -> str:
    return "pfx:" + hashlib.sha256(np.asarray(tokens, dtype=np.int32).tobytes()).hexdigest()[:16]


@dataclass
class Prefix:
    key: str
    seq: int
    tokens: list[int]
    pieces: list[tuple[str, str, list[int]]]     # (block name, text, tokens): system, tools
    users: set[str] = field(default_factory=set)


class PrefixRegistry:
    """Prefix sequences keyed by token hash; the least recently used one is replaced when full."""

    def __init__(self, seqs: list[int]) -> None:
        self.seqs = seqs
        self._by_key: OrderedDict[str, Prefix] = OrderedDict()

    def get(self, key: str) -> Prefix | None:
        prefix = self._by_key.get(key)
        if prefix is not None:
            self._by_key.move_to_end(key)
        return prefix

    def free_seq(self) -> tuple[int, Prefix | None]:
        """A sequence for a new prefix, and the prefix it displaces (if any)."""
        used = {p.seq for p in self._by_key.values()}
        for seq in self.seqs:
            if seq not in used:
                return seq, None
        _, oldest = self._by_key.popitem(last=False)
        return oldest.seq, oldest

    def add(self, prefix: Prefix) -> None:
        self._by_key[prefix.key] = prefix

    def all(self) -> list[Prefix]:
        return list(self._by_key.values())

    def clear(self) -> None:
        self._by_key.clear()
