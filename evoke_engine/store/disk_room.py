"""The disk's free space as the files written there see it (the K/V spill, the KV files): a reading, the blocks a
file takes whole, and the writes and deletes a reading does not show yet.

Invariants: a file counts at whole blocks; a reading that fails leaves no room; a reading with no `settle` is taken as
exact at once (nothing measured); `DiskRoom.short` commits the disk (syncfs) only when a file does not fit and some
change is still unshown.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)


def disk_free(path: Path) -> int:
    return shutil.disk_usage(path).free


class LocalDisk:
    """This machine's disks as the spill sees them: a free-space reading (bytes this process may write), the
    allocation unit a file takes whole, and a commit after which the reading shows every write and delete made."""

    def __call__(self, path: Path) -> int:
        return disk_free(path)

    @staticmethod
    def block_bytes(path: Path) -> int:
        return os.statvfs(path).f_frsize if hasattr(os, "statvfs") else 4096

    @staticmethod
    def settle(path: Path) -> None:
        """syncfs(2) of the filesystem holding `path` (btrfs commits then; xfs frees deleted files' blocks and trims
        speculative preallocation); `os.sync` where there is no syncfs; nothing where there is neither."""
        libc = _libc()
        if libc is not None and hasattr(libc, "syncfs"):
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            try:
                if libc.syncfs(fd) != 0:
                    code = ctypes.get_errno()
                    raise OSError(code, os.strerror(code))
            finally:
                os.close(fd)
        elif hasattr(os, "sync"):
            os.sync()


LOCAL_DISK = LocalDisk()


@functools.cache
def _libc() -> ctypes.CDLL | None:
    if os.name != "posix":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    except OSError:
        return None


class DiskRoom:
    """The room files may still take in `folder` above the disk's reserve: the free-space reading less the writes
    that reading does not show yet (the pool's spill files, the KV files). Each write and delete is measured by the
    reading's change across it (ext4, tmpfs and xfs show a write at once, btrfs at its next commit, xfs and btrfs a
    delete at the next commit); when a file does not fit and something is unshown, the disk is committed (`settle`)
    and read again. A file counts at the whole blocks it takes. A reading that fails (OSError) leaves no room. A
    reading with no `settle` is taken as exact at once: nothing is measured."""

    def __init__(self, folder: Path, reserve_bytes: int, reading: Callable[[Path], int]) -> None:
        self.folder, self.reserve_bytes, self._reading = folder, reserve_bytes, reading
        self._commit: Callable[[Path], None] | None = getattr(reading, "settle", None)
        self._measured = bool(reserve_bytes) and self._commit is not None
        self.unshown_written = 0          # bytes of this pool's files the reading has not shown as taken
        self.unshown_freed = 0            # bytes of deleted files the reading has not shown as free
        self.settles = 0
        self._block: int | None = None

    @property
    def block(self) -> int:
        if self._block is None:
            measure = getattr(self._reading, "block_bytes", None)     # a plain reading: exact bytes, 1-byte blocks
            try:
                self._block = max(1, measure(self.folder)) if measure is not None else 1
            except OSError:
                self._block = 4096
        return self._block

    def footprint(self, nbytes: int) -> int:
        """The disk a file of `nbytes` takes: whole blocks."""
        return -(-nbytes // self.block) * self.block

    def short(self, nbytes: int) -> int:
        """Bytes a new file of `nbytes` would take out of the reserve (0: it fits)."""
        if not self.reserve_bytes:
            return 0
        over = self._over(nbytes)
        if over > 0 and (self.unshown_written or self.unshown_freed) and self._settle():
            over = self._over(nbytes)
        return max(0, over)

    def _over(self, nbytes: int) -> int:
        free = self._read()
        if free is None:
            return self.footprint(nbytes)                 # cannot tell: do not write
        return self.reserve_bytes + self.footprint(nbytes) + self.unshown_written - free

    def _read(self) -> int | None:
        try:
            return self._reading(self.folder)
        except OSError:
            return None

    def _settle(self) -> bool:
        if self._commit is None:
            return False
        try:
            self._commit(self.folder)
        except OSError as exc:
            log.debug("cannot commit the disk of %s (%s): its reading may lag", self.folder, exc)
            return False
        self.settles += 1
        self.unshown_written = self.unshown_freed = 0
        return True

    @contextlib.contextmanager
    def writing(self, nbytes: int) -> Iterator[None]:
        """Around a file's write: what of its blocks the reading does not show is counted as taken."""
        with self._watching(nbytes) as unshown:
            yield
        self.unshown_written += unshown(-1)

    @contextlib.contextmanager
    def deleting(self, nbytes: int) -> Iterator[None]:
        """Around a file's delete: what the reading does not show as freed is not counted free (until a settle)."""
        with self._watching(nbytes) as unshown:
            yield
        self.unshown_freed += unshown(+1)

    @contextlib.contextmanager
    def _watching(self, nbytes: int) -> Iterator[Callable[[int], int]]:
        """The reading before the change inside; `unshown(sign)` after it: how much of the file's blocks the reading
        did not show move the way `sign` says (+1 free space grew, -1 it shrank); 0 where readings are not measured."""
        before = self._read() if self._measured else None

        def unshown(sign: int) -> int:
            if not self._measured:
                return 0
            after = self._read()
            shown = sign * (after - before) if before is not None and after is not None else 0
            return max(0, self.footprint(nbytes) - max(0, shown))
        yield unshown
