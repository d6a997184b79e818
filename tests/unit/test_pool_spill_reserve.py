"""Issue 57: the spill never leaves the disk's free space under `reserve_bytes`, counting the file it writes at the
room it takes (whole blocks), on a disk whose reading shows writes and deletes only at its next commit (btrfs) too.

Invariants checked: after every put the disk's true free space is at or above the reserve; only what the new file
needs is dropped; a reserve of 0 never reads the disk; the refusals log once. Fake disks on plain files, no model.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from evoke_engine.kvcache.blocks import Block, BlockState
from evoke_engine.kvcache.pool import LOCAL_DISK, SavedPool
from evoke_engine.runtime.kv import SavedKV

pytestmark = pytest.mark.unit

BLOCK = 4096                      # the fake disks' allocation unit
RESERVE = 64 * BLOCK
LOCK = BLOCK                      # the spill folder's lock file takes a block as well


def saved(n: int, fill: int) -> SavedKV:
    return SavedKV(bytearray([fill]) * n, origin_pos=0, n_tokens=4)


def block(name: str, role: str = "file") -> Block:
    return Block(name=name, role=role, turn=1, tokens=[1, 2, 3, 4], text=name)


class Disk:
    """A disk of `capacity` bytes whose files take whole blocks; the reading is exact at once (ext4, tmpfs)."""

    def __init__(self, folder: Path, capacity: int) -> None:
        self.folder, self.capacity = folder, capacity
        self.other_bytes = 0                       # written by someone else (KV files, SQLite, another program)
        self.reads = 0

    def used(self) -> int:
        files = [p for p in self.folder.rglob("*") if p.is_file()]
        return self.other_bytes + sum(-(-p.stat().st_size // BLOCK) * BLOCK for p in files)

    def true_free(self) -> int:
        return self.capacity - self.used()

    def __call__(self, path: Path) -> int:
        self.reads += 1
        return self.true_free()

    def block_bytes(self, path: Path) -> int:
        return BLOCK

    def settle(self, path: Path) -> None:
        pass


class LaggingDisk(Disk):
    """btrfs: the reading shows writes and deletes only at a commit (every 30 s, or `settle`: syncfs)."""

    def __init__(self, folder: Path, capacity: int) -> None:
        super().__init__(folder, capacity)
        self.shown = capacity
        self.commits = 0

    def __call__(self, path: Path) -> int:
        self.reads += 1
        return self.shown

    def settle(self, path: Path) -> None:
        self.commits += 1
        self.shown = self.true_free()


def test_a_reading_that_shows_writes_late_never_lets_spill_into_the_reserve(tmp_path):
    """The tester's growth under the reserve: each spill read the same free space, its earlier files unshown."""
    disk = LaggingDisk(tmp_path, RESERVE + LOCK + 5 * 3 * BLOCK)          # room for five files of three blocks
    pool = SavedPool(0, tmp_path, reserve_bytes=RESERVE, free_bytes=disk)
    blocks = [block(f"b{i}") for i in range(12)]
    for i, b in enumerate(blocks):
        pool.put(b, saved(3 * BLOCK - 100, i))
        assert disk.true_free() >= RESERVE, f"after b{i}: {RESERVE - disk.true_free()} bytes into the reserve"
    on_disk = [b for b in blocks if pool.where(b) is BlockState.DISK]
    assert on_disk == blocks[-5:]                                 # the room is used, oldest dropped first
    assert disk.commits >= 1 and pool.drops == 7


def test_drops_the_reading_shows_late_free_only_what_the_new_file_needs(tmp_path):
    disk = LaggingDisk(tmp_path, RESERVE + LOCK + 3 * 2 * BLOCK)
    pool = SavedPool(0, tmp_path, reserve_bytes=RESERVE, free_bytes=disk)
    first = [block(f"a{i}") for i in range(3)]
    for i, b in enumerate(first):
        pool.put(b, saved(2 * BLOCK, i))
    disk.settle(tmp_path)                                        # the disk's own commit: the reading is exact
    last = block("last")
    pool.put(last, saved(2 * BLOCK, 9))                          # one file must go; its delete shows at the commit
    assert [pool.where(b) for b in first] == [None, BlockState.DISK, BlockState.DISK]
    assert pool.where(last) is BlockState.DISK and pool.drops == 1
    assert disk.true_free() >= RESERVE


def test_a_spill_file_counts_at_the_blocks_it_takes(tmp_path, caplog):
    """5,000 bytes fit in 6,000 free above the reserve by their bytes, not by their two blocks."""
    disk = Disk(tmp_path, RESERVE + LOCK + 6000)
    pool = SavedPool(0, tmp_path, reserve_bytes=RESERVE, free_bytes=disk)
    with caplog.at_level(logging.WARNING, logger="evoke_engine.kvcache.pool"):
        big = [block(f"big{i}") for i in range(3)]
        for i, b in enumerate(big):
            pool.put(b, saved(5000, i))
            assert disk.true_free() >= RESERVE
        assert all(pool.where(b) is None for b in big) and pool.drops == 3
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1     # once, not per block
    small = block("small")
    pool.put(small, saved(4000, 7))                              # one block: it fits
    assert pool.where(small) is BlockState.DISK and disk.true_free() == RESERVE + 6000 - BLOCK


def test_a_parked_image_with_no_room_above_the_reserve_stays_in_ram(tmp_path):
    disk = LaggingDisk(tmp_path, RESERVE + LOCK + 2 * BLOCK)
    pool = SavedPool(0, tmp_path, reserve_bytes=RESERVE, free_bytes=disk)
    images = [block(f"image{i}", role="image") for i in range(3)]
    for i, image in enumerate(images):
        pool.put(image, saved(2 * BLOCK, i))
        assert disk.true_free() >= RESERVE
    assert [pool.where(i) for i in images] == [BlockState.DISK, BlockState.RAM, BlockState.RAM]
    assert pool.ram_bytes == 4 * BLOCK and pool.drops == 0


def test_another_writer_filling_the_disk_stops_the_spill_and_drops_nothing_spilled(tmp_path):
    disk = Disk(tmp_path, RESERVE + LOCK + 4 * BLOCK)
    pool = SavedPool(0, tmp_path, reserve_bytes=RESERVE, free_bytes=disk)
    a = block("a")
    pool.put(a, saved(BLOCK, 1))
    disk.other_bytes = 4 * BLOCK                                 # free is now one block under the reserve
    b = block("b")
    pool.put(b, saved(BLOCK, 2))                                 # dropping a would not make room: nothing goes but b
    assert pool.where(a) is BlockState.DISK and pool.where(b) is None
    assert len(list(pool.spill_dir.glob("*.kv"))) == 1


def test_no_reserve_never_reads_the_disk(tmp_path):
    disk = Disk(tmp_path, 1 << 30)
    pool = SavedPool(0, tmp_path, free_bytes=disk)
    for i in range(4):
        pool.put(block(f"b{i}"), saved(1000, i))
    assert disk.reads == 0 and pool.spill_bytes == 4000


def test_the_local_disk_reads_settles_and_knows_its_block(tmp_path):
    assert LOCAL_DISK(tmp_path) > 0 and LOCAL_DISK.block_bytes(tmp_path) >= 512
    (tmp_path / "x").write_bytes(b"1" * 10_000)
    LOCAL_DISK.settle(tmp_path)                                  # syncfs (or sync): no error on a local disk
