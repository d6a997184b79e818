"""Host pool for saved K/V bytes: RAM up to a byte budget, then spill files that come back on use.

Invariants: `ram_bytes` equals the bytes held in RAM; least recently used entries spill first;
a block's state mirrors where its bytes are (RAM or DISK) while the pool holds them; spill
files live under one directory of this process and are removed by `close`; bytes shared by two
blocks (a forked conversation) are counted once and freed when the last holder lets go.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections import Counter, OrderedDict
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
        self._holders: Counter = Counter()        # id(SavedKV) or spill path -> entries holding it
        self.ram_bytes = 0
        self.spills = 0
        self.on_spill = on_spill

    def __contains__(self, block: Block) -> bool:
        return id(block) in self._ram or id(block) in self._disk

    def put(self, block: Block, saved: SavedKV) -> None:
        self.discard(block)
        self._hold_ram(block, saved)
        self._spill_past_budget()

    def _hold_ram(self, block: Block, saved: SavedKV) -> None:
        self._ram[id(block)] = (block, saved)
        self._holders[id(saved)] += 1
        if self._holders[id(saved)] == 1:
            self.ram_bytes += saved.nbytes
        block.state = BlockState.RAM

    def _let_go(self, holder_key, nbytes: int = 0, path: Path | None = None) -> bool:
        """One entry fewer holds these bytes; True when it was the last (bytes freed)."""
        self._holders[holder_key] -= 1
        if self._holders[holder_key] > 0:
            return False
        del self._holders[holder_key]
        self.ram_bytes -= nbytes
        if path is not None:
            path.unlink(missing_ok=True)
        return True

    def share(self, source: Block, target: Block) -> None:
        """`target` holds the same saved bytes as `source` (a fork): no copy, counted once."""
        self.discard(target)
        key = id(source)
        if key in self._ram:
            self._hold_ram(target, self._ram[key][1])
        else:
            _, path, origin, n_tokens = self._disk[key]
            self._disk[id(target)] = (target, path, origin, n_tokens)
            self._holders[str(path)] += 1
            target.state = BlockState.DISK

    def take(self, block: Block) -> SavedKV:
        """Remove and return the bytes of `block` (from RAM or its spill file). Bytes a fork still
        holds are handed out too: a restore re-anchors them in place and updates `origin_pos` for both."""
        key = id(block)
        if key in self._ram:
            _, saved = self._ram.pop(key)
            self._let_go(id(saved), saved.nbytes)
            return saved
        _, path, origin, n_tokens = self._disk.pop(key)
        try:
            data = bytearray(path.read_bytes())
        finally:
            self._let_go(str(path), path=path)
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
            saved = self._ram.pop(key)[1]
            self._let_go(id(saved), saved.nbytes)
        elif key in self._disk:
            path = self._disk.pop(key)[1]
            self._let_go(str(path), path=path)

    def nbytes(self, block: Block) -> int:
        key = id(block)
        if key in self._ram:
            return self._ram[key][1].nbytes
        if key in self._disk:
            return self._disk[key][1].stat().st_size
        return 0

    def disk_bytes(self) -> int:
        paths = {path for _, path, _, _ in self._disk.values()}
        return sum(path.stat().st_size for path in paths if path.exists())

    def _spill_past_budget(self) -> None:
        while self.ram_bytes > self.ram_budget_bytes and self._ram:
            key, (block, saved) = next(iter(self._ram.items()))
            holders = [k for k, (_, s) in self._ram.items() if s is saved]   # a fork's blocks spill together
            path = self.spill_dir / f"{key}.kv"
            try:
                with path.open("wb") as fh:
                    fh.write(saved.data)
            except OSError as exc:          # full disk: keep it in RAM rather than lose it
                log.warning("spill of %s failed (%s); kept in RAM", block.name, exc)
                return
            for holder in holders:
                held, _ = self._ram.pop(holder)
                self._let_go(id(saved), saved.nbytes)
                self._disk[holder] = (held, path, saved.origin_pos, saved.n_tokens)
                self._holders[str(path)] += 1
                held.state = BlockState.DISK
                self.spills += 1
                if self.on_spill is not None:
                    self.on_spill(held)

    def close(self) -> None:
        self._ram.clear()
        self._disk.clear()
        self._holders.clear()
        self.ram_bytes = 0
        shutil.rmtree(self.spill_dir, ignore_errors=True)
