"""Which free slot a conversation gets (kvcache/slots.py), on the plain registry: beside a streaming reply's slot
first (a KV stream layout decodes a run of consecutive slots as one ubatch), then the slot that served the fewest."""

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
