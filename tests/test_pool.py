"""The host pool: RAM up to a byte budget, least recently used spill to files, transparent return."""

from __future__ import annotations

import builtins
import errno

import pytest

from evoke_engine.blocks import Block, BlockState
from evoke_engine.errors import RestoreError
from evoke_engine.kv import SavedKV
from evoke_engine.pool import SavedPool


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
    assert pool.ram_bytes == 2000 and a.state is BlockState.RAM
    pool.put(c, saved(1000, 3))
    assert spilled == [a] and a.state is BlockState.DISK and pool.ram_bytes == 2000
    assert pool.disk_bytes() == 1000
    back = pool.take(a)
    assert bytes(back.data) == bytes([1]) * 1000 and back.origin_pos == 10 and back.n_tokens == 4
    assert a not in pool and pool.disk_bytes() == 0
    pool.close()
    assert not pool.spill_dir.exists()


def test_full_disk_keeps_the_bytes_in_ram(tmp_path, monkeypatch):
    pool = SavedPool(500, tmp_path)
    real_open = builtins.open

    def full_disk(path, mode="r", *args, **kwargs):
        if "w" in mode and str(path).startswith(str(pool.spill_dir)):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", full_disk)
    monkeypatch.setattr("pathlib.Path.open", lambda self, mode="r", *a, **k: full_disk(self, mode, *a, **k))
    a, b = block("a"), block("b")
    pool.put(a, saved(400, 1))
    pool.put(b, saved(400, 2))
    assert a.state is BlockState.RAM and b.state is BlockState.RAM and pool.ram_bytes == 800
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
    assert a.state is BlockState.DISK
    for path in pool.spill_dir.glob("*.kv"):
        path.unlink()
    with pytest.raises(RestoreError, match="spill file"):
        pool.take(a)
    assert a not in pool and a.state is BlockState.DROPPED and pool.disk_bytes() == 0
    with pytest.raises(RestoreError, match="holds no saved bytes"):
        pool.take(a)


def test_a_lower_ram_budget_spills_at_once(tmp_path):
    pool = SavedPool(10_000, tmp_path)
    a, b = block("a"), block("b")
    pool.put(a, saved(400, 1))
    pool.put(b, saved(400, 2))
    pool.set_budget(500)
    assert pool.ram_budget_bytes == 500 and a.state is BlockState.DISK and b.state is BlockState.RAM
