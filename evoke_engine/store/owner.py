"""One owner per data folder: the lock an Engine holds on its data folder from start to close.

Two processes on one folder (the window and `serve`) would each run `KVFileStore.check(fix=True)` at start-up,
deleting the other's temporary files, and both would write the same conversation's KV file.

Invariants: on POSIX the lock is `flock` on a descriptor of the data folder itself (a directory cannot be
replaced under an open descriptor by deleting a file in it: deleting `LOCK_NAME` frees nothing, issue 42), taken
without waiting; `filelock.FileLock` on `LOCK_NAME` is held as well (the only lock where `fcntl` is missing, and the
one older versions take); each `DataFolderLock` opens its own descriptors, so a second owner is refused in the same
process as well as in another one; the OS drops both locks when the process dies (kill -9 included), so a crash
never leaves a folder locked; the lock file stays and is 0600; a data folder created here is 0700 whatever the umask.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from filelock import FileLock, Timeout

from ..errors import DataDirInUseError
from .private import FILE_MODE, private_mkdir

try:
    import fcntl
except ImportError:          # Windows: the lock file only
    fcntl = None

log = logging.getLogger(__name__)
LOCK_NAME = "evoke-desk.lock"


class DataFolderLock:
    """The owner's hold on a data folder: `acquire` (DataDirInUseError when another owner has it), `release`."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        # thread_local=False: an engine is often closed from another thread than the one that made it
        self._lock = FileLock(self.folder / LOCK_NAME, timeout=0, mode=FILE_MODE, thread_local=False)
        self._folder_fd: int | None = None       # the data folder, flocked while held (POSIX)

    @property
    def held(self) -> bool:
        return self._lock.is_locked

    def acquire(self) -> DataFolderLock:
        self._lock_folder()
        try:
            self._lock.acquire()
        except Timeout:
            self._unlock_folder()
            raise DataDirInUseError(self.folder) from None
        log.info("data folder %s held (flock on the folder itself%s)", self.folder,
                 " and on " + LOCK_NAME if self._folder_fd is not None else ": no fcntl here, " + LOCK_NAME + " only")
        return self

    def _lock_folder(self) -> None:
        if fcntl is None:
            return
        private_mkdir(self.folder)                 # 0700 whatever the umask (a created folder is private)
        fd = os.open(self.folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise DataDirInUseError(self.folder) from None
        self._folder_fd = fd

    def _unlock_folder(self) -> None:
        fd, self._folder_fd = self._folder_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)                     # closing the only descriptor drops the flock

    def release(self) -> None:
        """Give the folder up (idempotent)."""
        self._lock.release(force=True)
        self._unlock_folder()
