"""Which free slot a conversation gets (kvcache/slots.py), on the plain registry: beside a streaming reply's slot
first (a KV stream layout decodes a run of consecutive slots as one ubatch), then one in the longest free run, then
the slot that served the fewest; and which idle conversation next to given slots was used longest ago."""

from evoke_engine.kvcache.slots import SlotRegistry


def test_with_nothing_streaming_the_least_used_then_lowest_slot_goes_first():
    slots = SlotRegistry(4)
    slots.pin("a", 0)
    slots.release("a")
    assert slots.free_slot() == 1


def test_a_free_slot_beside_a_streaming_one_goes_first():
    slots = SlotRegistry(5)
    slots.pin("streaming", 3)
    assert slots.free_slot(beside={3}) in (2, 4)
    assert slots.free_slot(beside={3}) == 2                  # both touch it: the lower one
    slots.pin("other", 2)
    assert slots.free_slot(beside={2, 3}) in (1, 4)


def test_no_free_slot_beside_falls_back_to_the_usual_order():
    slots = SlotRegistry(5)
    for i, slot in enumerate((1, 2, 3)):
        slots.pin(f"c{i}", slot)
    assert slots.free_slot(beside={2}) == 0


def test_with_nothing_streaming_a_slot_in_the_longest_free_run_goes_first():
    slots = SlotRegistry(6)
    slots.pin("a", 1)
    slots.pin("b", 4)
    slots.release("b")
    slots.pin("c", 2)                  # free: 0 alone, and 3-5 (slot 4 served one already)
    assert slots.free_slot() == 3      # in the run of three, the least used: replies starting with it stay one run


def test_the_least_recent_neighbour_of_given_slots():
    slots = SlotRegistry(5)
    for name, slot in (("old", 0), ("mid", 2), ("new", 4), ("streaming", 3)):
        slots.pin(name, slot)
    assert slots.least_recent(exclude={"streaming"}) == "old"
    assert slots.least_recent(exclude={"streaming"}, touching={3}) == "mid"     # 2 and 4 touch 3; 2 used longer ago
    assert slots.least_recent(exclude={"streaming", "mid", "new"}, touching={3}) is None
