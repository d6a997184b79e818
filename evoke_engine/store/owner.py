"""One owner per data folder: the lock an Engine holds on its data folder from start to close.

Two processes on one folder (the window and `serve`) would each run `KVFileStore.check(fix=True)` at start-up,
deleting the other's temporary files, and both would write the same conversation's KV file.

Invariants: the lock is `filelock.FileLock` (an OS lock, flock on POSIX) on `LOCK_NAME` in the data folder,
taken without waiting; each `DataFolderLock` opens its own descriptor, so a second owner is refused in the same
process as well as in another one; the OS drops the lock when the process dies (kill -9 included), so a crash
never leaves a folder locked; the lock file stays (deleting it would split waiters across inodes) and is 0600.
"""

from __future__ import annotations

from pathlib import Path

from filelock import FileLock, Timeout

from ..errors import DataDirInUseError
from .private import FILE_MODE

LOCK_NAME = "evoke-desk.lock"


class DataFolderLock:
    """The owner's hold on a data folder: `acquire` (DataDirInUseError when another owner has it), `release`."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        # thread_local=False: an engine is often closed from another thread than the one that made it
        self._lock = FileLock(self.folder / LOCK_NAME, timeout=0, mode=FILE_MODE, thread_local=False)

    @property
    def held(self) -> bool:
        return self._lock.is_locked

    def acquire(self) -> DataFolderLock:
        try:
            self._lock.acquire()
        except Timeout:
            raise DataDirInUseError(self.folder) from None
        return self

    def release(self) -> None:
        """Give the folder up (idempotent)."""
        self._lock.release(force=True)

