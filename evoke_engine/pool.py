"""Host pool for saved K/V bytes: RAM up to a byte budget, then spill files that come back on use.

Invariants: `ram_bytes` equals the bytes held in RAM; least recently used entries spill first;
a block's state mirrors where its bytes are (RAM or DISK) while the pool holds them; spill
files live under one directory of this process and are removed by `close`.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from .blocks import Block, BlockState
from .kv import SavedKV

log = logging.getLogger(__name__)


class SavedPool:
    def __init__(self, ram_budget_bytes: int, spill_root: Path,
                 on_spill: Callable[[Block], None] | None = None) -> None:
        self.ram_budget_bytes = ram_budget_bytes
        spill_root.mkdir(parents=True, exist_ok=True)
        self.spill_dir = Path(tempfile.mkdtemp(prefix=f"spill-{os.getpid()}-", dir=spill_root))
        self._ram: OrderedDict[int, tuple[Block, SavedKV]] = OrderedDict()
        self._disk: dict[int, tuple[Block, Path, int, int]] = {}
        self.ram_bytes = 0
        self.spills = 0
        self.on_spill = on_spill

    def __contains__(self, block: Block) -> bool:
        return id(block) in self._ram or id(block) in self._disk

    def put(self, block: Block, saved: SavedKV) -> None:
        self.discard(block)
        self._ram[id(block)] = (block, saved)
        self.ram_bytes += saved.nbytes
        block.state = BlockState.RAM
        self._spill_past_budget()

    def take(self, block: Block) -> SavedKV:
        """Remove and return the bytes of `block` (from RAM or its spill file)."""
        key = id(block)
        if key in self._ram:
            _, saved = self._ram.pop(key)
            self.ram_bytes -= saved.nbytes
            return saved
        _, path, origin, n_tokens = self._disk.pop(key)
        data = bytearray(path.read_bytes())
        path.unlink(missing_ok=True)
        return SavedKV(data=data, origin_pos=origin, n_tokens=n_tokens)

    def peek_bytes(self, block: Block) -> tuple[bytes, int, int]:
        """(bytes, origin_pos, n_tokens) without removing them (persistence)."""
        key = id(block)
        if key in self._ram:
            saved = self._ram[key][1]
            return bytes(saved.data), saved.origin_pos, saved.n_tokens
        _, path, origin, n_tokens = self._disk[key]
        return path.read_bytes(), origin, n_tokens

    def discard(self, block: Block) -> None:
        key = id(block)
        if key in self._ram:
            self.ram_bytes -= self._ram.pop(key)[1].nbytes
        elif key in self._disk:
            self._disk.pop(key)[1].unlink(missing_ok=True)

    def nbytes(self, block: Block) -> int:
        key = id(block)
        if key in self._ram:
            return self._ram[key][1].nbytes
        if key in self._disk:
            return self._disk[key][1].stat().st_size
        return 0

    def disk_bytes(self) -> int:
        return sum(path.stat().st_size for _, path, _, _ in self._disk.values() if path.exists())

    def _spill_past_budget(self) -> None:
        while self.ram_bytes > self.ram_budget_bytes and self._ram:
            key, (block, saved) = self._ram.popitem(last=False)
            path = self.spill_dir / f"{key}.kv"
            try:
                with path.open("wb") as fh:
                    fh.write(saved.data)
            except OSError as exc:          # full disk: keep it in RAM rather than lose it
                log.warning("spill of %s failed (%s); kept in RAM", block.name, exc)
                self._ram[key] = (block, saved)
                self._ram.move_to_end(key, last=False)
                return
            self.ram_bytes -= saved.nbytes
            self._disk[key] = (block, path, saved.origin_pos, saved.n_tokens)
            block.state = BlockState.DISK
            self.spills += 1
            if self.on_spill is not None:
                self.on_spill(block)

    def close(self) -> None:
        self._ram.clear()
        self._disk.clear()
        self.ram_bytes = 0
        shutil.rmtree(self.spill_dir, ignore_errors=True)
