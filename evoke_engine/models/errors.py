"""Errors of the model catalogue, the hub and downloads, each with a message a user can act on.

Invariant: every one is an `EvokeError` (a `Cancelled` for a stop asked for), so callers that catch the engine's
errors catch these too; a message names the endpoint, the file or the folder it is about, never a traceback.
"""

from __future__ import annotations

from ..errors import Cancelled, EvokeError


class ModelHubError(EvokeError):
    """A model could not be listed or downloaded (the base of this package's errors)."""


class CatalogueError(ModelHubError):
    """The model catalogue file is missing a field or holds a wrong value (a bug in the shipped file)."""


class HubUnreachableError(ModelHubError):
    """The hub did not answer: offline, a proxy or firewall, a wrong HF_ENDPOINT, or HF_HUB_OFFLINE set."""

    def __init__(self, endpoint: str, reason: str) -> None:
        self.endpoint = endpoint
        super().__init__(f"cannot reach the model hub at {endpoint}: {reason}. Models already on disk still work; "
                         "check the network (or HF_ENDPOINT, a proxy) and try again")


class HubNotFoundError(ModelHubError):
    """The repository, revision or file is not on the hub (or is private or gated for this user)."""


class DiskSpaceError(ModelHubError):
    """The models folder's disk has less free space than the download needs; checked before writing anything."""

    def __init__(self, folder: object, needed_bytes: int, free_bytes: int, spare_bytes: int = 0) -> None:
        self.folder, self.needed_bytes, self.free_bytes = folder, needed_bytes, free_bytes
        spare = f" (and {format_bytes(spare_bytes)} to spare)" if spare_bytes else ""
        super().__init__(f"not enough disk space in {folder}: the download needs {format_bytes(needed_bytes)}"
                         f"{spare}, {format_bytes(free_bytes)} is free. Free some space (or move the data folder "
                         "with EVOKE_HOME) and try again")


class ChecksumMismatchError(ModelHubError):
    """The downloaded bytes do not have the sha256 the hub lists; the partial file was deleted."""

    def __init__(self, file: str, expected: str, actual: str) -> None:
        self.file, self.expected, self.actual = file, expected, actual
        super().__init__(f"{file} arrived damaged: its sha256 is {actual[:12]}…, the hub lists {expected[:12]}…. "
                         "Nothing was kept; pull it again (if it fails again, the hub's copy or a proxy is at fault)")


class DownloadInterruptedError(ModelHubError):
    """The connection kept dropping; what arrived is kept and the next pull resumes from it."""


class DownloadCancelled(Cancelled):  # noqa: N818 - a stop asked for, not a failure
    """The download stopped at the caller's request."""


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'; sizes as a person reads them."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
