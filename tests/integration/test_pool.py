"""The host pool: RAM up to a byte budget, least recently used spill to files within a cap and the disk's
reserve, transparent return; spill folders of processes that are gone are removed."""

from __future__ import annotations

import builtins
import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evoke_engine.errors import RestoreError
from evoke_engine.kvcache.blocks import Block, BlockState
from evoke_engine.kvcache.pool import SavedPool
from evoke_engine.runtime.kv import SavedKV

ROOT = Path(__file__).resolve().parents[2]


def saved(n: int, fill: int) -> SavedKV:
    return SavedKV(bytearray([fill]) * n, origin_pos=10, n_tokens=4)


def block(name: str) -> Block:
    return Block(name=name, role="file", turn=1, tokens=[1, 2, 3, 4], text=name)


def test_spills_least_recently_used_past_the_budget_and_reads_back(tmp_path):
    spilled = []
    pool = SavedPool(2500, tmp_path, on_spill=spilled.append)
    a, b, c = block("a"), block("b"), block("c")
    pool.put(a, saved(1000, 1))
    pool.put(b, saved(1000, 2))
    assert pool.ram_bytes == 2000 and pool.where(a) is BlockState.RAM
    pool.put(c, saved(1000, 3))
    assert spilled == [a] and pool.where(a) is BlockState.DISK and pool.ram_bytes == 2000
    assert pool.disk_bytes() == 1000
    back = pool.take(a)
    assert bytes(back.data) == bytes([1]) * 1000 and back.origin_pos == 10 and back.n_tokens == 4
    assert a not in pool and pool.disk_bytes() == 0
    pool.close()
    assert not pool.spill_dir.exists()


class _FillsUp:
    """A spill file on a disk that fills up half way through the write."""

    def __init__(self, fh) -> None:
        self.fh = fh

    def write(self, data) -> int:
        self.fh.write(bytes(data[: len(data) // 2]))
        self.fh.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.fh.close()


def test_full_disk_keeps_the_bytes_in_ram_and_leaves_no_partial_file(tmp_path, monkeypatch):
    pool = SavedPool(500, tmp_path)
    monkeypatch.setattr("evoke_engine.kvcache.pool.open", lambda fd, mode: _FillsUp(builtins.open(fd, mode)),  # noqa: SIM115
                        raising=False)
    a, b = block("a"), block("b")
    pool.put(a, saved(400, 1))
    pool.put(b, saved(400, 2))
    assert pool.where(a) is BlockState.RAM and pool.where(b) is BlockState.RAM and pool.ram_bytes == 800
    assert list(pool.spill_dir.glob("*.kv")) == [] and pool.spill_bytes == 0
    assert bytes(pool.take(a).data) == bytes([1]) * 400


def test_discard_and_peek(tmp_path):
    pool = SavedPool(10_000, tmp_path)
    a = block("a")
    pool.put(a, saved(100, 7))
    data, origin, n = pool.peek_bytes(a)
    assert data == bytes([7]) * 100 and (origin, n) == (10, 4) and a in pool
    pool.discard(a)
    assert a not in pool and pool.ram_bytes == 0


def test_a_deleted_spill_file_is_a_restore_error_and_the_block_is_dropped(tmp_path):
    pool = SavedPool(0, tmp_path)
    a = block("a")
    pool.put(a, saved(100, 1))
    assert pool.where(a) is BlockState.DISK
    for path in pool.spill_dir.glob("*.kv"):
        path.unlink()
    with pytest.raises(RestoreError, match="spill file"):
        pool.take(a)
    assert a not in pool and pool.where(a) is None and pool.disk_bytes() == 0
    with pytest.raises(RestoreError, match="holds no saved bytes"):
        pool.take(a)


def test_a_lower_ram_budget_spills_at_once(tmp_path):
    pool = SavedPool(10_000, tmp_path)
    a, b = block("a"), block("b")
    pool.put(a, saved(400, 1))
    pool.put(b, saved(400, 2))
    pool.set_budget(500)
    assert pool.ram_budget_bytes == 500 and pool.where(a) is BlockState.DISK and pool.where(b) is BlockState.RAM


# -- spill folders of processes that are gone ---------------------------------------------------------
CHILD_POOL = """
import sys
from pathlib import Path
from evoke_engine.kvcache.blocks import Block
from evoke_engine.runtime.kv import SavedKV
from evoke_engine.kvcache.pool import SavedPool
pool = SavedPool(0, Path(sys.argv[1]))
pool.put(Block(name="a", role="file", turn=1, tokens=[1], text="a"), SavedKV(bytearray(1000), 0, 1))
print(pool.spill_dir, flush=True)
sys.stdin.read()
"""


def test_spill_folders_of_killed_and_dead_processes_are_removed_live_ones_kept(tmp_path):
    root = tmp_path / "spill"
    child = subprocess.Popen([sys.executable, "-c", CHILD_POOL, str(root)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        other_live = Path(child.stdout.readline().strip())
        assert list(other_live.glob("*.kv")), "the child spilled"
        exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                                text=True, check=True)
        dead_pid = int(exited.stdout)                          # a process that is gone (no lock file: legacy)
        legacy_dead = root / f"spill-{dead_pid}-legacy"
        legacy_live = root / f"spill-{os.getpid()}-legacy"     # no lock file, pid alive: cannot tell, kept
        reused = root / f"spill-{os.getpid()}-reused"          # pid alive but its lock is free: pid reused
        for folder in (legacy_dead, legacy_live, reused):
            folder.mkdir()
            (folder / "1.kv").write_bytes(b"x" * 100)
        (reused / "owner.lock").write_text("1\n")
        own = SavedPool(0, root)
        second = SavedPool(0, root)                            # a second pool of this process keeps the first's
        assert own.spill_dir.exists() and other_live.exists() and legacy_live.exists()
        assert not legacy_dead.exists() and not reused.exists()

        child.kill()                                           # kill -9: no close, the folder stays behind
        child.wait()
        assert other_live.exists()
        third = SavedPool(0, root)
        assert not other_live.exists()
        assert own.spill_dir.exists() and second.spill_dir.exists() and third.spill_dir.exists()
        for pool in (own, second, third):
            pool.close()
        assert sorted(p.name for p in root.iterdir()) == [legacy_live.name]
    finally:
        child.kill()
        child.wait()


# -- the spill cap and the disk's reserve --------------------------------------------------------------
def pool_state_is_consistent(pool: SavedPool, blocks: list[Block]) -> None:
    for b in blocks:
        assert (pool.where(b) in (BlockState.RAM, BlockState.DISK)) == (b in pool), b.name
    on_disk = {p for p in pool.spill_dir.glob("*.kv")}
    assert pool.spill_bytes == sum(p.stat().st_size for p in on_disk) == pool.disk_bytes()
    assert pool.ram_bytes == sum(pool.nbytes(b) for b in blocks if pool.where(b) is BlockState.RAM)


def test_spill_stops_at_its_cap_and_drops_the_least_recently_used(tmp_path):
    dropped: list[Block] = []
    pool = SavedPool(1000, tmp_path, spill_budget_bytes=2000, on_drop=dropped.append)
    blocks = [block(f"b{i}") for i in range(6)]
    for i, b in enumerate(blocks[:3]):
        pool.put(b, saved(1000, i))
    assert [pool.where(b) for b in blocks[:3]] == [BlockState.DISK, BlockState.DISK, BlockState.RAM]
    assert pool.spill_bytes == 2000
    pool.put(blocks[3], saved(1000, 3))                        # b2 spills: b0, the oldest on disk, makes room
    assert dropped == [blocks[0]] and pool.where(blocks[0]) is None and blocks[0] not in pool
    assert [pool.where(b) for b in blocks[1:4]] == [BlockState.DISK, BlockState.DISK, BlockState.RAM]
    assert pool.spill_bytes == 2000 and pool.drops == 1
    pool_state_is_consistent(pool, blocks)
    with pytest.raises(RestoreError, match="holds no saved bytes"):
        pool.take(blocks[0])                                   # recovery treats it as dropped: text only
    assert bytes(pool.take(blocks[1]).data) == bytes([1]) * 1000 and pool.spill_bytes == 1000
    pool.put(blocks[4], saved(3000, 4))                        # b3 spills; b4 is larger than the whole cap:
    assert pool.where(blocks[4]) is None and dropped[-1] is blocks[4]   # dropped, and nothing else
    assert pool.where(blocks[2]) is pool.where(blocks[3]) is BlockState.DISK
    assert pool.spill_bytes == 2000 and pool.ram_bytes == 0
    pool_state_is_consistent(pool, blocks)
    pool.close()


def test_a_forks_shared_spill_file_is_dropped_for_both_and_counted_once(tmp_path):
    pool = SavedPool(0, tmp_path, spill_budget_bytes=1500)
    a, fork_a, b = block("a"), block("a-fork"), block("b")
    pool.put(a, saved(1000, 1))
    pool.share(a, fork_a)
    assert pool.spill_bytes == 1000 and pool.where(fork_a) is BlockState.DISK
    pool.put(b, saved(1000, 2))
    assert pool.where(a) is pool.where(fork_a) is None and pool.where(b) is BlockState.DISK
    pool_state_is_consistent(pool, [a, fork_a, b])


def test_a_parked_conversations_image_is_never_dropped_it_stays_in_ram(tmp_path):
    pool = SavedPool(0, tmp_path, spill_budget_bytes=1000)
    image = Block(name="slot-image", role="image", turn=1, tokens=[], text="")
    pool.put(image, saved(800, 1))
    other = Block(name="slot-image", role="image", turn=1, tokens=[], text="")
    pool.put(other, saved(800, 2))                             # no room, and images are not dropped
    assert pool.where(image) is BlockState.DISK and pool.where(other) is BlockState.RAM and pool.ram_bytes == 800
    b = block("b")
    pool.put(b, saved(100, 3))                                 # a block still spills past the kept image
    assert pool.where(b) is BlockState.DISK and pool.spill_bytes == 900
    pool_state_is_consistent(pool, [image, other, b])


def test_spill_never_writes_into_the_disks_reserve(tmp_path):
    disk = {"free": 10_000}

    def free_bytes(path: Path) -> int:
        return disk["free"] - sum(p.stat().st_size for p in path.glob("*.kv"))

    pool = SavedPool(0, tmp_path, reserve_bytes=8000, free_bytes=free_bytes)
    a, b, c = block("a"), block("b"), block("c")
    pool.put(a, saved(1500, 1))
    assert pool.where(a) is BlockState.DISK                          # 8500 free after it
    pool.put(b, saved(1500, 2))                                # would leave 7000 < 8000: a goes for room
    assert pool.where(a) is None and pool.where(b) is BlockState.DISK and free_bytes(pool.spill_dir) == 8500
    disk["free"] = 8500                                        # something else filled the disk: 7000 free
    pool.put(c, saved(1000, 3))                                # even without b it would not fit: nothing else goes
    assert pool.where(c) is None and pool.where(b) is BlockState.DISK
    assert free_bytes(pool.spill_dir) >= 0 and pool.spill_bytes == 1500
    pool_state_is_consistent(pool, [a, b, c])


def test_the_real_disks_free_space_is_read(tmp_path):
    pool = SavedPool(0, tmp_path, reserve_bytes=1 << 60)       # no disk has that much free: nothing spills
    a = block("a")
    pool.put(a, saved(100, 1))
    assert pool.where(a) is None and list(pool.spill_dir.glob("*.kv")) == []
