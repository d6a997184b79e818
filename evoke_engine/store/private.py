"""Files and folders only their owner can read: chat history, settings, sessions and KV bytes are private.

Invariants: whatever the umask, a folder made here is 0700 and a file written here is 0600 (created with
that mode by `os.open`/`mkdir`, which a umask can only narrow); `private_mkdir` also narrows a folder that
already exists (installs from before this rule). On systems without POSIX modes (Windows) the modes are
what the platform gives; the calls still create and write.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)


def _narrow(path: Path, mode: int) -> None:
    """chmod `path` to `mode` unless it already is; a failure (not ours, read-only) is logged, not raised."""
    if os.name != "posix":
        return
    try:
        if (path.stat().st_mode & 0o777) != mode:
            os.chmod(path, mode)
    except FileNotFoundError:
        return
    except OSError as error:
        log.warning("cannot make %s private (mode %o): %s", path, mode, error)


def private_mkdir(path: Path) -> Path:
    """Create `path` and its missing parents as 0700 folders; an existing `path` is narrowed to 0700.
    Existing parents are left alone (they may be the user's own, e.g. ~/.local/share)."""
    path = Path(path)
    missing = []
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing.append(folder)
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    for folder in {path, *missing}:
        _narrow(folder, DIR_MODE)
    return path


def private_file(path: Path) -> None:
    """Narrow an existing file to 0600 (start-up repair of files written before this rule)."""
    _narrow(Path(path), FILE_MODE)


def create_private(path: Path) -> int:
    """A new file at `path`, opened for writing with mode 0600 (fails if it exists); returns the fd."""
    return os.open(path, _CREATE_FLAGS, FILE_MODE)


def private_write_bytes(path: Path, data: bytes) -> None:
    """Replace `path` atomically with `data` in a 0600 file (a temp file beside it, then `os.replace`).
    Raises OSError with the old file intact and no temp file left."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()                                   # a leftover of a crashed write of this pid
    fd = create_private(tmp)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def private_write_text(path: Path, text: str, encoding: str = "utf-8") -> None:
    """`private_write_bytes` of `text` encoded."""
    private_write_bytes(path, text.encode(encoding))
