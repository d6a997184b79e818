"""Which conversation holds which llama.cpp sequence (slot).

Invariants: a slot holds at most one conversation; a conversation holds at most one slot;
`least_recent` is the conversation used longest ago; a free slot beside a streaming reply's goes first (a KV stream
layout decodes a run of consecutive slots as one ubatch), then the one that served the fewest.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection

from ..errors import InvariantError


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

    def free_slot(self, beside: Collection[int] = ()) -> int | None:
        """A free slot, next to one of `beside` (the streaming replies' slots) where one is: llama.cpp decodes the
        KV streams of a step together only as a run of consecutive sequences, each further run a pass of its own."""
        free = [s for s in range(self.n_slots) if s not in self._holder]
        return min(free, key=lambda s: (s - 1 not in beside and s + 1 not in beside, self.load[s], s)) if free else None

    def least_recent(self, exclude: Collection[str | None] = ()) -> str | None:
        """The conversation used longest ago but those in `exclude` (the one coming in, replies streaming)."""
        return next((c for c in self._lru if c not in exclude), None)

    def pin(self, conversation_id: str, slot: int) -> None:
        if slot in self._holder:
            raise InvariantError(f"slot {slot} is held by {self._holder[slot]}")
        if conversation_id in self._lru:
            raise InvariantError(f"{conversation_id} already holds a slot")
        self._holder[slot] = conversation_id
        self._lru[conversation_id] = slot
        self.load[slot] += 1

    def release(self, conversation_id: str) -> int:
        slot = self._lru.pop(conversation_id)
        del self._holder[slot]
        return slot
