"""The one exception the store raises for environment failures: disk full, locked, read-only, damaged file.

Invariant: a `StoreError` always blames the machine or the file, never the caller's code; programming
errors (bad SQL, wrong types, unknown ids) keep their own exception types.
"""

from __future__ import annotations

import errno
from pathlib import Path

from evoke_engine.errors import EvokeError

DISK_FULL = "disk_full"
LOCKED = "locked"
READ_ONLY = "read_only"
PERMISSION = "permission"
CORRUPT = "corrupt"
CANNOT_OPEN = "cannot_open"
NEWER_SCHEMA = "newer_schema"
OUT_OF_MEMORY = "out_of_memory"
MISSING = "missing"
IO = "io"


class StoreError(EvokeError):
    """An environment failure with a message a user can act on; `reason` is one of the constants above."""

    def __init__(self, message: str, *, reason: str, path: Path | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.path = path


def reason_of_os_error(error: OSError) -> str:
    """Classify an OSError by errno into one of the reason constants."""
    if error.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return DISK_FULL
    if error.errno == errno.ENOENT:
        return MISSING
    if error.errno == errno.EROFS:
        return READ_ONLY
    if error.errno in (errno.EACCES, errno.EPERM):
        return PERMISSION
    return IO


def describe_os_error(action: str, path: Path, error: OSError) -> StoreError:
    """Build a StoreError for a failed file operation, e.g. `describe_os_error("write KV file", p, e)`."""
    reason = reason_of_os_error(error)
    cause = {
        DISK_FULL: "the disk is full",
        READ_ONLY: "the file system is read-only",
        PERMISSION: "permission denied",
        MISSING: "it does not exist",
    }.get(reason, "I/O error")
    detail = error.strerror or str(error)
    return StoreError(f"cannot {action} {path}: {cause} ({detail})", reason=reason, path=path)
