"""The resident sequence is the only writer of positions, states and cells; the pool only says where bytes are."""

from __future__ import annotations

import inspect
import re
import threading
from pathlib import Path

import pytest
from helpers.rig import Rig

from evoke_engine.errors import InvariantError, RestoreError
from evoke_engine.kvcache.blocks import Block, BlockState
from evoke_engine.kvcache.pool import SavedPool
from evoke_engine.memory import recovery
from evoke_engine.memory.memory import ConversationMemory
from evoke_engine.memory.snapshot import decode_payload, encode_payload
from evoke_engine.runtime.kv import SavedKV
from evoke_engine.runtime.runtime import Cancelled

pytestmark = pytest.mark.unit

ENGINE = Path(__file__).resolve().parents[2] / "evoke_engine"


def holds_exactly_its_table(rig: Rig, *memories) -> None:
    """Positions contiguous, states as the pool says, the slot's cells the table's blocks."""
    for memory in memories:
        memory.check()
        assert [b.pos for b in memory.table.resident] == \
            [sum(b.n_tokens for b in memory.table.resident[:i]) for i in range(len(memory.table.resident))]
        if memory.seq is not None:
            assert rig.kv.layout(memory.seq) == rig.expected_layout(memory)


# -- the pool reports, it never writes a block's state ---------------------------------------------------
class Watched(Block):
    """A block that fails the test when anything assigns its state once it is armed."""

    def __setattr__(self, name, value):
        if name == "state" and self.__dict__.get("armed"):
            raise AssertionError(f"{self.name}.state written ({value}) by {inspect.stack()[1].function}")
        object.__setattr__(self, name, value)


def watched(name: str, role: str = "file") -> Watched:
    block = Watched(name=name, role=role, turn=1, tokens=[1, 2, 3, 4], text=name)
    block.armed = True
    return block


def saved(n: int, fill: int = 1) -> SavedKV:
    return SavedKV(bytearray([fill]) * n, origin_pos=10, n_tokens=4)


class Owner:
    def __init__(self) -> None:
        self.moves: list[tuple[str, BlockState]] = []

    def bytes_moved(self, block: Block, where: BlockState) -> None:
        self.moves.append((block.name, where))


def test_the_pool_never_writes_block_state_it_returns_and_reports_the_tier(tmp_path):
    owner = Owner()
    pool = SavedPool(1500, tmp_path, spill_budget_bytes=2000)
    a, b, c, d = (watched(n) for n in "abcd")
    assert pool.put(a, saved(1000), owner) is BlockState.RAM and pool.where(a) is BlockState.RAM
    assert pool.put(b, saved(1000), owner) is BlockState.RAM           # a spills
    assert owner.moves == [("a", BlockState.DISK)] and pool.where(a) is BlockState.DISK
    fork = watched("a-fork")
    assert pool.share(a, fork, owner) is BlockState.DISK
    pool.put(c, saved(1000), owner)                                    # b spills: 2000 on disk, the cap
    pool.put(d, saved(1000), owner)                                    # c spills: a's file (and the fork) go
    assert owner.moves[-3:] == [("a", BlockState.DROPPED), ("a-fork", BlockState.DROPPED), ("c", BlockState.DISK)]
    assert pool.where(a) is pool.where(fork) is None
    assert pool.put(watched("huge"), saved(5000), owner) is BlockState.DROPPED   # no room anywhere
    assert owner.moves[-1] == ("huge", BlockState.DROPPED)
    assert [pool.where(x) for x in (b, c, d)] == [None, BlockState.DISK, BlockState.DISK]   # d spilled, b made room
    with pytest.raises(RestoreError, match="holds no saved bytes"):
        pool.take(a)
    assert bytes(pool.take(c).data) == bytes([1]) * 1000
    assert all(blk.state is BlockState.RESIDENT for blk in (a, b, c, d, fork))   # untouched: nobody wrote them
    pool.close()


def test_blocks_are_dict_keys_by_identity():
    one, two = (Block(name="x", role="file", turn=1, tokens=[1, 2], text="x") for _ in range(2))
    assert one != two and len({one, two}) == 2 and {one: 1, two: 2}[two] == 2


# -- the only writer ---------------------------------------------------------------------------------------
WRITES = re.compile(r"\.(state|pos) = |\.seq = |\.table = |BlockTable\.from_blocks|\bid\((b|block)\)|"
                    r"\.table\.(append|split|place_at_tail|remove_resident|forget|mark_bytes|mark_private|"
                    r"mark_sibling_shared)\(")


def test_only_the_resident_sequence_writes_positions_states_slots_and_the_table():
    offenders = [f"{path.relative_to(ENGINE)}:{n}: {line.strip()}"
                 for path in sorted(ENGINE.rglob("*.py")) if path.name not in ("blocks.py", "resident.py")
                 for n, line in enumerate(path.read_text().splitlines(), 1) if WRITES.search(line)]
    assert offenders == []


def test_recovery_strategies_are_pure_objects_over_blocks():
    source = inspect.getsource(recovery)
    assert "memory" not in re.sub(r'""".*?"""', "", source, flags=re.S).replace("ConversationMemory", "")
    blocks = [Block(name=n, role=r, turn=1, tokens=[1], text=n, state=s) for n, r, s in [
        ("a", "file", BlockState.RAM), ("b", "file", BlockState.DISK), ("c", "user", BlockState.DROPPED),
        ("d", "file", BlockState.DROPPED), ("breadcrumb:d", "breadcrumb", BlockState.RESIDENT)]]
    blocks[-1].pos = 0
    assert [b.name for b in recovery.backend("kv_restore").candidates(blocks)] == ["a", "b"]
    assert [b.name for b in recovery.backend("breadcrumb").candidates(blocks)] == ["c"]
    assert recovery.backend("discard").candidates(blocks) == []
    assert recovery.Breadcrumb.marker(blocks[0]) == "[earlier a: a]\n"


# -- every operation keeps the table equal to the slot --------------------------------------------------
def test_positions_stay_contiguous_and_equal_to_the_cells_after_every_operation(rig):
    memory = rig.memory()
    blocks = [rig.add(memory, "file", 16, priority=p) for p in (0.1, 0.9, 0.1, 0.9, 0.9)]
    holds_exactly_its_table(rig, memory)
    memory.evict_to(memory.active_tokens - 20)                         # two low-priority blocks leave, saved
    assert [b.state for b in blocks[:3]] == [BlockState.RAM, BlockState.RESIDENT, BlockState.RAM]
    holds_exactly_its_table(rig, memory)
    memory.restore_block(blocks[2])
    assert memory.table.resident[-1] is blocks[2]
    holds_exactly_its_table(rig, memory)
    reply = rig.block("assistant", 4)
    memory.sequence.append([reply])
    memory.sequence.extend_tail(reply, rig.tokens_for(6, "more"))
    assert reply.n_tokens == 10
    holds_exactly_its_table(rig, memory)
    pieces = [Block(name=f"assistant#1.{i}", role="assistant", turn=1, tokens=reply.tokens[i * 5:i * 5 + 5],
                    text="") for i in range(2)]
    memory.sequence.split(reply, pieces)
    holds_exactly_its_table(rig, memory)
    with pytest.raises(InvariantError, match="not the last resident block"):
        memory.sequence.extend_tail(pieces[0], [1])
    memory.remove_blocks([blocks[1], blocks[0]])                        # a resident and a saved one, for good
    assert blocks[0] not in rig.pool and blocks[1] not in memory.table.blocks
    holds_exactly_its_table(rig, memory)
    memory.park()
    holds_exactly_its_table(rig, memory)
    rig.enter_slot(memory, 2)
    holds_exactly_its_table(rig, memory)


def test_a_cancelled_append_leaves_neither_cells_nor_a_block(rig):
    memory = rig.memory()
    rig.add(memory, "user", 16)
    before = rig.kv.layout(memory.seq)
    cancel = threading.Event()
    cancel.set()
    block = rig.block("file", 16)
    with pytest.raises(Cancelled):
        memory.append_decoded(block, cancel=cancel)
    assert block not in memory.table.blocks and rig.kv.layout(memory.seq) == before
    holds_exactly_its_table(rig, memory)


def test_spill_and_drop_reach_the_blocks_through_their_sequence(rig):
    memory = rig.memory()
    blocks = [rig.add(memory, "file", 16, priority=p) for p in (0.1, 0.1, 0.1, 0.9, 0.9, 0.9)]
    memory.evict_to(memory.active_tokens - 40)
    saved = [b for b in blocks if b.state is BlockState.RAM]
    assert len(saved) == 3
    rig.pool.set_budget(0)                                             # the pool spills them all
    assert [b.state for b in saved] == [BlockState.DISK] * 3
    holds_exactly_its_table(rig, memory)
    rig.pool.spill_budget_bytes = rig.pool.spill_bytes                 # the disk's cap reached
    rig.pool.put(rig.block("file", 4), rig.kv.save(memory.seq, 0, 4))   # the oldest spill file goes for room
    assert [b.state for b in saved] == [BlockState.DISK, BlockState.DISK, BlockState.DROPPED]   # victims go in
    holds_exactly_its_table(rig, memory)                                                         # last first
    assert memory.candidates() == saved[:2]


def test_a_parked_image_that_spills_says_disk_and_still_comes_back(rig):
    memory = rig.memory()
    for _ in range(3):
        rig.add(memory, "user", 16)
    layout = rig.kv.layout(0)
    memory.park()
    assert memory.memory_location() == "ram" and memory.image.state is BlockState.RAM
    rig.pool.set_budget(0)
    assert memory.memory_location() == "disk" and memory.image.state is BlockState.DISK
    rig.enter_slot(memory, 1)
    assert rig.kv.layout(1) == layout and memory.image is None
    holds_exactly_its_table(rig, memory)
    with pytest.raises(InvariantError, match="already in slot"):
        memory.unpark(2)


def test_a_fork_holds_its_own_blocks_and_both_follow_the_pool(rig):
    parent = rig.memory("parent", seq=0)
    first = rig.add(parent, "file", 16, priority=0.01)
    for _ in range(10):
        rig.add(parent, "file", 16, priority=0.9)
    assert first.state is BlockState.RAM
    child = rig.memory("child", seq=1)
    parent.share_into(child)
    copy = child.table.by_name(first.name)
    assert copy is not first and copy.state is BlockState.RAM
    assert {b.name for b in child.table.blocks} == {b.name for b in parent.table.blocks}
    assert not set(child.table.blocks) & set(parent.table.blocks)       # clones, each table its own
    holds_exactly_its_table(rig, parent, child)
    rig.pool.set_budget(0)                                              # the shared bytes spill once, for both
    assert first.state is copy.state is BlockState.DISK
    holds_exactly_its_table(rig, parent, child)
    child.release()
    assert copy.state is BlockState.DROPPED and first.state is BlockState.DISK and first in rig.pool
    holds_exactly_its_table(rig, parent)


def test_the_opening_held_ahead_keeps_its_kind_through_a_park_and_a_kv_file(rig):
    """The next message's opening held ahead stays an opening (`ahead_opening`) parked, in the file and back in a
    slot, so a block brought back at the tail moves it instead of dropping it; a draft's words held ahead never do."""
    memory = rig.memory()
    blocks = [rig.add(memory, "file", 16, priority=p) for p in (0.1, 0.9, 0.9)]
    memory.evict_to(memory.active_tokens - 10)
    assert blocks[0].state is BlockState.RAM
    opening = rig.tokens_for(2, "opening")
    memory.sequence.extend_tail(blocks[-1], [], ahead=opening, logits_last=False)
    memory.sequence.decode_ahead([*opening, *rig.tokens_for(3, "draft")])        # typing on: the words are no opening
    assert rig.kv.ahead_opening(memory.seq) == 2 and rig.kv.ahead_tokens(memory.seq) == 5
    memory.park()
    payload = encode_payload(memory.snapshot("prefix", [{"role": "user", "content": "x", "evoke_turn": 1}]))
    memory.release()
    snapshot = decode_payload(payload)
    assert snapshot.ahead_opening == 2 and len(snapshot.ahead) == 5
    loaded = ConversationMemory("c2", settings=rig.settings, runtime=rig.rt, kv=rig.kv, pool=rig.pool,
                                embedder=rig.embedder, emit=rig.events.append)
    loaded.load_snapshot(snapshot, rig.prefix_tokens)
    rig.enter_slot(loaded, 1)
    assert rig.kv.ahead_opening(1) == 2
    tail = loaded.active_tokens
    loaded.restore_block(loaded.table.by_name(blocks[0].name))
    assert rig.kv.held_ahead(1) == opening, "the opening moved past the block; the draft's words were dropped"
    assert loaded.active_tokens == tail + blocks[0].n_tokens
    loaded.check()
    held = [(loaded.active_tokens + i, t) for i, t in enumerate(opening)]
    assert rig.kv.layout(1) == [*rig.expected_layout(loaded), *held]


def test_a_snapshot_loads_into_a_fresh_sequence_with_states_from_the_pool(rig):
    memory = rig.memory()
    blocks = [rig.add(memory, "file", 16, priority=p) for p in (0.1, 0.1, 0.9, 0.9, 0.9)]
    memory.evict_to(memory.active_tokens - 20)
    assert [b.state for b in blocks[:2]] == [BlockState.RAM] * 2
    rig.pool.discard(blocks[0])                                         # lost on the way: only its text is left
    memory.sequence.table.mark_bytes(blocks[0], BlockState.DROPPED)
    layout = rig.kv.layout(memory.seq)
    memory.park()
    payload = encode_payload(memory.snapshot("prefix", [{"role": "user", "content": "x", "evoke_turn": 1}]))
    memory.release()
    loaded = ConversationMemory("c2", settings=rig.settings, runtime=rig.rt, kv=rig.kv, pool=rig.pool,
                                embedder=rig.embedder, emit=rig.events.append)
    rig.pool.set_budget(0)                                              # what the pool holds spills as it lands
    loaded.load_snapshot(decode_payload(payload), rig.prefix_tokens)
    states = {b.name: b.state for b in loaded.table.blocks}
    assert states[blocks[0].name] is BlockState.DROPPED and states[blocks[1].name] is BlockState.DISK
    assert loaded.memory_location() == "disk" and loaded.image.state is BlockState.DISK
    holds_exactly_its_table(rig, loaded)
    rig.enter_slot(loaded, 1)
    assert rig.kv.layout(1) == layout
    holds_exactly_its_table(rig, loaded)
    loaded.restore_block(loaded.table.by_name(blocks[1].name))
    holds_exactly_its_table(rig, loaded)
