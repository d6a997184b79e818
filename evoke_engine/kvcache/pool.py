"""Host pool for saved K/V bytes: RAM up to a byte budget, then spill files that come back on use.

Invariants: `ram_bytes` equals the bytes held in RAM and `spill_bytes` the bytes in this pool's spill
files; least recently used entries spill first; the pool never writes a block's state: it says where the
bytes are (`put`/`share` return the tier, `where` tells it) and tells an entry's owner when they move
(`BytesOwner`: spilled to DISK, or let go for want of room, DROPPED: the block's text still rebuilds it);
spill never takes `spill_bytes` past `spill_budget_bytes` nor the disk's free space under `reserve_bytes` (room
the chat history needs), a file counted at the whole blocks it takes and a reading never trusted to show the
pool's own writes and deletes (`DiskRoom`: btrfs shows them at its next commit); a parked conversation's slot
image is never dropped (it stays in RAM instead); bytes shared by two blocks (a forked conversation) are counted
once and freed when the last holder lets go. With `bits` 8 or 4, blocks are held packed (kvquant: RAM and `.kvq`
spill files, counted at their packed size) and unpacked on take; blocks kvquant does not cover (a q8_0 cache) and
slot images are held as they are; packed bytes that do not unpack are a RestoreError (the entry is gone). Bytes of
a deferred save (their rows still copying on a worker) are waited for before the pool reads them (pack, spill,
peek). Spill files live under one 0700 folder of this process, locked (flock) while the pool lives and removed by
`close`; a new pool removes the folders of pools whose process is gone.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import tempfile
from collections import Counter, OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from ..errors import RestoreError
from ..runtime.kv import SavedKV
from ..settings import POOL_BITS  # 16: the bytes as llama.cpp wrote them; 8, 4: kvquant's packed forms
from ..store.disk_room import LOCAL_DISK, DiskRoom
from ..store.private import create_private, private_mkdir
from . import kvquant
from .blocks import Block, BlockState
from .host_memory import map_large_buffers
from .kvquant import PackedKV

try:
    import fcntl
except ImportError:               # Windows: no flock; spill folders of other processes are left alone
    fcntl = None

log = logging.getLogger(__name__)

SPILL_DIR = re.compile(r"spill-(\d+)-")
LOCK_NAME = "owner.lock"
NEVER_DROPPED = frozenset({"image"})    # roles whose bytes are a parked conversation, not one block


def _pid_alive(pid: int) -> bool:
    """False only when no process has this pid (POSIX); elsewhere, or when unsure, True."""
    if pid == os.getpid():
        return True
    if os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):   # OverflowError: no pid is that large
        return False
    except OSError:               # EPERM: alive, another user's
        return True
    return True


def _lock_folder(folder: Path) -> int | None:
    """Hold an exclusive flock on `folder/owner.lock` for the pool's lifetime; returns the fd. The lock is
    taken on a temp name and renamed into place, so no other process ever sees an unlocked owner file."""
    if fcntl is None:
        return None
    temp = folder / f".{LOCK_NAME}.tmp"
    fd = os.open(temp, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.replace(temp, folder / LOCK_NAME)
    except OSError:
        os.close(fd)
        raise
    return fd


def _orphaned(folder: Path, pid: int) -> bool:
    """Whether the pool that made `folder` is gone: its owner lock can be taken (the process died, whatever
    pid it had or has been reused for); a folder without a lock file (made before locks, or being made
    this instant) only when no process has its pid."""
    if fcntl is None:
        return False
    try:
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return not _pid_alive(pid)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:               # held: a live pool owns it
        return False
    finally:
        os.close(fd)
    return True


def remove_orphan_spill_dirs(spill_root: Path) -> list[Path]:
    """Remove the spill folders under `spill_root` whose pool's process is gone (killed, crashed);
    folders of live pools, this process's included, stay. Returns the removed folders."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(spill_root))
    except OSError:
        return removed
    for entry in entries:
        match = SPILL_DIR.match(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False):
            continue
        folder = Path(entry.path)
        if _orphaned(folder, int(match[1])):
            shutil.rmtree(folder, ignore_errors=True)
            if not folder.exists():
                removed.append(folder)
                log.info("removed the spill folder %s of a process that is gone", folder)
    return removed


def _read_into_bytearray(path: Path) -> bytearray:
    """A spill file's bytes in one writable buffer (no intermediate `bytes` copy of a block's K/V)."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        data = bytearray(size)
        if fh.readinto(data) != size:
            raise OSError(f"short read of {path}")
    return data


def _allocate(fd: int, nbytes: int) -> None:
    """Allocate a new file's `nbytes` before they are written, where the filesystem can (ENOSPC raises)."""
    if nbytes <= 0 or not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            raise
        # EOPNOTSUPP, EINVAL (a filesystem without it): the write allocates as it goes


def _wait(held: SavedKV | PackedKV) -> None:
    """Bytes of a deferred save (`KVCache.save_deferred`) are whole before the pool reads them."""
    if isinstance(held, SavedKV):
        held.wait()


class BytesOwner(Protocol):
    """Who holds a pool entry's block (its resident sequence): told when the pool moves the bytes on its own."""

    def bytes_moved(self, block: Block, where: BlockState) -> None:
        """The bytes of `block` are now `where`: DISK (spilled) or DROPPED (let go for room)."""


class SavedPool:
    def __init__(self, ram_budget_bytes: int, spill_root: Path,
                 on_spill: Callable[[Block], None] | None = None, *, spill_budget_bytes: int | None = None,
                 reserve_bytes: int = 0, on_drop: Callable[[Block], None] | None = None,
                 free_bytes: Callable[[Path], int] = LOCAL_DISK, bits: int = 16) -> None:
        """`free_bytes` reads a disk's free space (OSError: cannot tell); `LocalDisk` also gives its block size and
        a commit (`settle`); a plain function is taken as exact at once, in bytes."""
        map_large_buffers()                  # freed blocks go back to the OS, not into heap holes
        self.ram_budget_bytes = ram_budget_bytes
        self.bits = 16
        self.set_bits(bits)
        self.spill_budget_bytes = spill_budget_bytes       # None: no cap but the disk's reserve
        self.reserve_bytes = reserve_bytes
        private_mkdir(spill_root)
        remove_orphan_spill_dirs(spill_root)
        self.spill_dir = Path(tempfile.mkdtemp(prefix=f"spill-{os.getpid()}-", dir=spill_root))   # 0700
        self.room = DiskRoom(self.spill_dir, reserve_bytes, free_bytes)
        try:
            with self.room.writing(len(f"{os.getpid()}\n")):
                self._lock_fd = _lock_folder(self.spill_dir)
        except OSError as exc:
            log.warning("cannot lock the spill folder %s (%s): a later start may remove it early",
                        self.spill_dir, exc)
            self._lock_fd = None
        self._ram: OrderedDict[Block, tuple[SavedKV | PackedKV, BytesOwner | None]] = OrderedDict()
        self._disk: dict[Block, tuple[Path, int, int, BytesOwner | None]] = {}   # path, origin_pos, n_tokens
        self._holders: Counter = Counter()        # id(SavedKV) or spill path -> entries holding it
        self._file_bytes: dict[str, int] = {}     # spill path -> its size
        self._files_made = 0                      # spill files are named by this serial
        self.ram_bytes = 0
        self.spill_bytes = 0
        self.spills = 0
        self.drops = 0
        self.on_spill = on_spill
        self.on_drop = on_drop
        self._warned: set[str] = set()

    def __contains__(self, block: Block) -> bool:
        return block in self._ram or block in self._disk

    def where(self, block: Block) -> BlockState | None:
        """RAM or DISK while the pool holds the bytes of `block`; None when it does not."""
        if block in self._ram:
            return BlockState.RAM
        return BlockState.DISK if block in self._disk else None

    def held(self, where: BlockState) -> list[Block]:
        """The blocks whose bytes the pool holds in RAM or on disk (`where`), oldest first."""
        return list(self._ram if where is BlockState.RAM else self._disk)

    def put(self, block: Block, saved: SavedKV, owner: BytesOwner | None = None) -> BlockState:
        """Hold the bytes of `block` (`owner` is told when they move later); returns where they are now: RAM,
        DISK (spilled at once) or DROPPED (no room for them anywhere)."""
        self.discard(block)
        self._hold_ram(block, self._packed(block, saved), owner)
        self._spill_past_budget()
        return self.where(block) or BlockState.DROPPED

    def set_bits(self, bits: int) -> None:
        """Hold blocks put from now on at `bits` (16 as they are, 8 or 4 packed); blocks held stay as they are."""
        if bits not in POOL_BITS:
            raise ValueError(f"pool bits must be one of {POOL_BITS}, got {bits}")
        self.bits = bits

    def _packed(self, block: Block, saved: SavedKV) -> SavedKV | PackedKV:
        if kvquant.is_packed(saved.data):          # a KV file held the block packed: it stays packed
            return PackedKV(bytes(saved.data), saved.origin_pos, saved.n_tokens)
        if self.bits == 16 or block.role in NEVER_DROPPED:
            return saved
        saved.wait()                               # a deferred save's rows are all there before they are packed
        packed = kvquant.pack(saved.data, self.bits)
        return saved if packed is None else PackedKV(packed, saved.origin_pos, saved.n_tokens)

    @staticmethod
    def _unpacked(block: Block, held: SavedKV | PackedKV) -> SavedKV:
        """The SavedKV of what the pool held; RestoreError for packed bytes that do not fit."""
        if isinstance(held, SavedKV):
            return held
        try:
            return SavedKV(data=kvquant.unpack(held.data), origin_pos=held.origin_pos, n_tokens=held.n_tokens)
        except kvquant.UnfitPacked as exc:
            raise RestoreError(f"the packed bytes of {block.name} do not fit: {exc}") from exc

    def _hold_ram(self, block: Block, saved: SavedKV | PackedKV, owner: BytesOwner | None) -> None:
        self._ram[block] = (saved, owner)
        self._holders[id(saved)] += 1
        if self._holders[id(saved)] == 1:
            self.ram_bytes += saved.nbytes

    def _let_go(self, holder_key, nbytes: int = 0, path: Path | None = None) -> bool:
        """One entry fewer holds these bytes; True when it was the last (bytes freed)."""
        self._holders[holder_key] -= 1
        if self._holders[holder_key] > 0:
            return False
        del self._holders[holder_key]
        self.ram_bytes -= nbytes
        if path is not None:
            nbytes = self._file_bytes.pop(str(path), 0)
            self.spill_bytes -= nbytes
            with contextlib.suppress(OSError), self.room.deleting(nbytes):
                path.unlink(missing_ok=True)
        return True

    def share(self, source: Block, target: Block, owner: BytesOwner | None = None) -> BlockState:
        """`target` holds the same saved bytes as `source` (a fork): no copy, counted once. Returns where
        they are (RAM or DISK)."""
        self.discard(target)
        if source in self._ram:
            self._hold_ram(target, self._ram[source][0], owner)
            return BlockState.RAM
        path, origin, n_tokens, _ = self._disk[source]
        self._disk[target] = (path, origin, n_tokens, owner)
        self._holders[str(path)] += 1
        return BlockState.DISK

    def set_budget(self, ram_budget_bytes: int) -> None:
        """Adopt a new RAM budget now: past it, the least recently used entries spill at once."""
        if ram_budget_bytes < 0:
            raise ValueError(f"ram_budget_bytes must be >= 0, got {ram_budget_bytes}")
        self.ram_budget_bytes = ram_budget_bytes
        self._spill_past_budget()

    def take(self, block: Block) -> SavedKV:
        """Remove and return the bytes of `block` (from RAM or its spill file). Bytes a fork still
        holds are handed out too: the direct path rotates K while it copies (the bytes stay as saved), the
        serialised path re-anchors them in place and updates `origin_pos`, which both holders see.
        Raises RestoreError when the pool does not hold the block, its spill file cannot be read or its
        packed bytes do not unpack; the entry is gone then (the bytes are lost: its text still rebuilds it)."""
        if block in self._ram:
            saved, _ = self._ram.pop(block)
            self._let_go(id(saved), saved.nbytes)
            return self._unpacked(block, saved)
        if block not in self._disk:
            raise RestoreError(f"the pool holds no saved bytes of {block.name}")
        path, origin, n_tokens, _ = self._disk.pop(block)
        try:
            data = _read_into_bytearray(path)
        except OSError as exc:
            raise RestoreError(f"the spill file of {block.name} is unreadable: {exc}") from exc
        finally:
            self._let_go(str(path), path=path)
        if path.suffix == ".kvq":
            return self._unpacked(block, PackedKV(bytes(data), origin, n_tokens))
        return SavedKV(data=data, origin_pos=origin, n_tokens=n_tokens)

    def peek_bytes(self, block: Block) -> tuple[bytes, int, int]:
        """(bytes, origin_pos, n_tokens) without removing them (persistence: packed bytes are unpacked, and
        RestoreError, with the entry kept, where they do not fit)."""
        if block in self._ram:
            saved = self._ram[block][0]
            _wait(saved)
            data, origin, n_tokens = saved.data, saved.origin_pos, saved.n_tokens
            packed = isinstance(saved, PackedKV)
        else:
            path, origin, n_tokens, _ = self._disk[block]
            data, packed = path.read_bytes(), path.suffix == ".kvq"
        if packed:
            try:
                data = kvquant.unpack(data)
            except kvquant.UnfitPacked as exc:
                raise RestoreError(f"the packed bytes of {block.name} do not fit: {exc}") from exc
        return bytes(data), origin, n_tokens

    def peek_stored(self, block: Block) -> tuple[bytes, int, int]:
        """(bytes, origin_pos, n_tokens) as the pool stores them, packed ones packed (a KV file keeps them so:
        `put` takes them back as they are)."""
        if block in self._ram:
            saved = self._ram[block][0]
            _wait(saved)
            return bytes(saved.data), saved.origin_pos, saved.n_tokens
        path, origin, n_tokens, _ = self._disk[block]
        return path.read_bytes(), origin, n_tokens

    def holds_exact(self, block: Block, origin_pos: int) -> bool:
        """The pool holds the bytes of `block` as llama.cpp wrote them (not packed), saved at `origin_pos`."""
        if block in self._ram:
            saved = self._ram[block][0]
            return isinstance(saved, SavedKV) and saved.origin_pos == origin_pos
        if block in self._disk:
            path, origin, _, _ = self._disk[block]
            return path.suffix != ".kvq" and origin == origin_pos
        return False

    def discard(self, block: Block) -> None:
        if block in self._ram:
            saved = self._ram.pop(block)[0]
            self._let_go(id(saved), saved.nbytes)
        elif block in self._disk:
            path = self._disk.pop(block)[0]
            self._let_go(str(path), path=path)

    def nbytes(self, block: Block) -> int:
        if block in self._ram:
            return self._ram[block][0].nbytes
        if block in self._disk:
            return self._disk[block][0].stat().st_size
        return 0

    def disk_bytes(self) -> int:
        paths = {path for path, _, _, _ in self._disk.values()}
        return sum(path.stat().st_size for path in paths if path.exists())

    # -- spill, within the cap and the disk's reserve --------------------------------------------
    def _bytes_short(self, nbytes: int) -> tuple[int, int]:
        """(bytes of spill files over the cap, bytes of disk into the reserve) once a file of `nbytes` is written:
        (0, 0) when it fits now."""
        over_cap = 0 if self.spill_budget_bytes is None else self.spill_bytes + nbytes - self.spill_budget_bytes
        return max(0, over_cap), self.room.short(nbytes)

    def _droppable_files(self) -> list[str]:
        """Spill files the pool may delete for room, least recently spilled first (no slot images)."""
        blocked = {str(path) for block, (path, _, _, _) in self._disk.items() if block.role in NEVER_DROPPED}
        order = dict.fromkeys(str(path) for path, _, _, _ in self._disk.values())
        return [path for path in order if path not in blocked]

    def _make_room(self, nbytes: int) -> bool:
        """Drop the least recently spilled blocks until `nbytes` fit; drops nothing when that cannot do it. The drops
        are counted (bytes for the cap, blocks for the reserve) and the disk is read again once they cover the
        shortfall: a reading may show a delete only at the disk's next commit (`DiskRoom.short` commits it)."""
        over_cap, over_reserve = self._bytes_short(nbytes)
        if not over_cap and not over_reserve:
            return True
        files = self._droppable_files()
        sizes = [self._file_bytes.get(path, 0) for path in files]
        if sum(sizes) < over_cap or sum(map(self.room.footprint, sizes)) < over_reserve:
            return False
        for path, size in zip(files, sizes, strict=True):
            self._drop_file(Path(path))
            over_cap, over_reserve = over_cap - size, over_reserve - self.room.footprint(size)
            if over_cap <= 0 and over_reserve <= 0:
                over_cap, over_reserve = self._bytes_short(nbytes)      # another writer may have taken more
                if not over_cap and not over_reserve:
                    return True
        return False

    def _dropped(self, block: Block, owner: BytesOwner | None) -> None:
        self.drops += 1
        if owner is not None:
            owner.bytes_moved(block, BlockState.DROPPED)
        if self.on_drop is not None:
            self.on_drop(block)

    def _drop_file(self, path: Path) -> None:
        for block in [b for b, (p, _, _, _) in self._disk.items() if p == path]:
            owner = self._disk.pop(block)[3]
            self._let_go(str(path), path=path)
            self._dropped(block, owner)
            log.info("dropped the spilled bytes of %s for room on disk", block.name)

    def _warn_once(self, what: str, message: str, *args) -> None:
        (log.debug if what in self._warned else log.warning)(message, *args)
        self._warned.add(what)

    def _spill_past_budget(self) -> None:
        kept: set[Block] = set()               # slot images with no room on disk: they stay in RAM
        while self.ram_bytes > self.ram_budget_bytes:
            block = next((b for b in self._ram if b not in kept), None)
            if block is None:
                return
            saved = self._ram[block][0]
            holders = ([b for b, (s, _) in self._ram.items() if s is saved]   # a fork's blocks spill together
                       if self._holders[id(saved)] > 1 else [block])
            if not self._make_room(saved.nbytes):
                if block.role in NEVER_DROPPED:
                    self._warn_once("image", "no room to spill %s (spill cap %s bytes, disk reserve %d bytes); "
                                    "kept in RAM", block.name, self.spill_budget_bytes, self.reserve_bytes)
                    kept.update(holders)
                    continue
                self._warn_once("drop", "spill is full (cap %s bytes, disk reserve %d bytes): the least recently "
                                "used saved blocks are dropped, their text rebuilds them",
                                self.spill_budget_bytes, self.reserve_bytes)
                for holder in holders:
                    owner = self._ram.pop(holder)[1]
                    self._let_go(id(saved), saved.nbytes)
                    self._dropped(holder, owner)
                continue
            self._files_made += 1
            path = self.spill_dir / f"{self._files_made}.{'kvq' if isinstance(saved, PackedKV) else 'kv'}"
            try:
                _wait(saved)
                with self.room.writing(saved.nbytes):
                    self._write(path, saved.data)
            except OSError as exc:          # full disk: keep it in RAM rather than lose it
                self._warn_once("write", "spill of %s failed (%s); kept in RAM", block.name, exc)
                return
            self._file_bytes[str(path)] = saved.nbytes
            self.spill_bytes += saved.nbytes
            for holder in holders:
                owner = self._ram.pop(holder)[1]
                self._let_go(id(saved), saved.nbytes)
                self._disk[holder] = (path, saved.origin_pos, saved.n_tokens, owner)
                self._holders[str(path)] += 1
                self.spills += 1
                if owner is not None:
                    owner.bytes_moved(holder, BlockState.DISK)
                if self.on_spill is not None:
                    self.on_spill(holder)

    @staticmethod
    def _write(path: Path, data: bytearray | memoryview) -> None:
        """`data` into a new 0600 file, its blocks allocated first (a full disk fails before a byte is written, and
        xfs adds no speculative preallocation past them); a failed write leaves no file behind."""
        try:
            fd = create_private(path)
            try:
                _allocate(fd, len(data))
            except OSError:
                os.close(fd)
                raise
            with open(fd, "wb") as fh:
                fh.write(data)
        except OSError:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            raise

    def close(self) -> None:
        self._ram.clear()
        self._disk.clear()
        self._holders.clear()
        self._file_bytes.clear()
        self.ram_bytes = self.spill_bytes = 0
        shutil.rmtree(self.spill_dir, ignore_errors=True)
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None
