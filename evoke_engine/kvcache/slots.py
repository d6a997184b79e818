"""Which conversation holds which llama.cpp sequence (slot).

Invariants: a slot holds at most one conversation; a conversation holds at most one slot;
`least_recent` is the conversation used longest ago (among those `touching` given slots, where asked); a free slot
beside a streaming reply's goes first (a KV stream layout decodes a run of consecutive slots as one ubatch), then one
in the longest run of free slots (room for the replies that start with it), then the one that served the fewest.
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
        KV streams of a step together only as a run of consecutive sequences, each further run a pass of its own;
        else one in the longest run of free slots, where the replies starting with it can stay one run."""
        free = [s for s in range(self.n_slots) if s not in self._holder]
        return min(free, key=lambda s: (not touches(s, beside), -self._free_run(s), self.load[s], s)) if free else None

    def _free_run(self, slot: int) -> int:
        """How many consecutive free slots `slot` is one of."""
        low = high = slot
        while low - 1 >= 0 and low - 1 not in self._holder:
            low -= 1
        while high + 1 < self.n_slots and high + 1 not in self._holder:
            high += 1
        return high - low + 1

    def least_recent(self, exclude: Collection[str | None] = (), touching: Collection[int] | None = None) -> str | None:
        """The conversation used longest ago but those in `exclude` (the one coming in, replies streaming); with
        `touching`, only one whose slot is next to one of those slots."""
        return next((c for c, slot in self._lru.items()
                     if c not in exclude and (touching is None or touches(slot, touching))), None)

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


def touches(slot: int, others: Collection[int]) -> bool:
    """Whether `slot` is next to one of `others` (so a step decodes them as one run)."""
    return slot - 1 in others or slot + 1 in others
