"""Downloading one GGUF from the hub into the models folder: resumable, verified, cancellable, with progress.

Invariants: bytes arrive in `models/.partial/OWNER/NAME/FILE.part` (a hidden folder and a name not ending in .gguf,
so no model list shows it) beside a `.json` note of the sha256 and size it is for; the file reaches
`models/OWNER/NAME/FILE` only by one `os.replace` after its size and sha256 match the hub's LFS listing. A wrong
sha256, a cancel (unless asked to keep it) and a changed upstream file delete the partial; a kill or a dropped
connection keep it, and the next pull of the same file asks only for the missing bytes (an HTTP Range). The free
disk space is checked before anything is written; one pull of a file at a time (a lock beside the partial).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .catalogue import Catalogue
from .errors import (
    ChecksumMismatchError,
    DiskSpaceError,
    DownloadCancelled,
    DownloadInterruptedError,
    HubUnreachableError,
    ModelHubError,
    format_bytes,
)
from .hub import HubFile, choose_file, hub_endpoint, hub_errors, list_gguf_files, parse_spec

PARTIAL_FOLDER = ".partial"
PARTIAL_SUFFIX = ".part"
SPACE_MARGIN_BYTES = 16 << 20         # left free on the disk beyond the download itself
PROGRESS_EVERY_S = 0.1
SPEED_WINDOW_S = 5.0


@dataclass(frozen=True)
class DownloadProgress:
    file: str
    done_bytes: int
    total_bytes: int
    speed_bps: float              # over the last few seconds
    eta_s: float | None           # None until a speed is known
    resumed_from: int = 0         # bytes that were already on disk from an earlier try

    @property
    def fraction(self) -> float:
        return self.done_bytes / self.total_bytes if self.total_bytes else 1.0


@dataclass(frozen=True)
class PulledModel:
    path: Path
    repo: str
    file: str
    size_bytes: int
    sha256: str | None            # None when the file was already there (not re-hashed)
    already_present: bool = False
    resumed_from: int = 0


ProgressCallback = Callable[[DownloadProgress], None]
DiskFree = Callable[[Path], int]


def disk_free(folder: Path) -> int:
    """Free bytes on the disk that holds `folder` (or its nearest existing parent)."""
    return shutil.disk_usage(_existing_parent(folder)).free


def _existing_parent(folder: Path) -> Path:
    folder = Path(folder).absolute()
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    return folder


def _safe_parts(repo: str, file: str) -> tuple[str, ...]:
    parts = (*repo.split("/"), *PurePosixPath(file).parts)
    if any(p in ("", ".", "..") or p.startswith(".") or "\\" in p for p in parts) or PurePosixPath(file).is_absolute():
        raise ModelHubError(f"refusing the file name {repo}/{file}: it would land outside the models folder")
    return parts


def destination(models_folder: Path, repo: str, file: str) -> Path:
    """Where a pulled file lives: `models/OWNER/NAME/FILE` (the layout LM Studio uses too)."""
    return Path(models_folder).joinpath(*_safe_parts(repo, file))


def partial_path(models_folder: Path, repo: str, file: str) -> Path:
    """Where its bytes gather until verified: `models/.partial/OWNER/NAME/FILE.part`."""
    path = Path(models_folder, PARTIAL_FOLDER).joinpath(*_safe_parts(repo, file))
    return path.with_name(path.name + PARTIAL_SUFFIX)


class _Meter:
    """Speed over a sliding window and the time left; calls back at most every PROGRESS_EVERY_S."""

    def __init__(self, file: str, total: int, start: int, callback: ProgressCallback | None) -> None:
        self.file, self.total, self.start, self.callback = file, total, start, callback
        self.samples: deque[tuple[float, int]] = deque([(time.monotonic(), start)])
        self.last_report = 0.0

    def update(self, done: int, force: bool = False) -> None:
        now = time.monotonic()
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[0][0] > SPEED_WINDOW_S:
            self.samples.popleft()
        if self.callback is None or (not force and now - self.last_report < PROGRESS_EVERY_S):
            return
        self.last_report = now
        t0, b0 = self.samples[0]
        elapsed = now - t0
        speed = (done - b0) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - done) / speed if speed > 0 else None
        self.callback(DownloadProgress(self.file, done, self.total, speed, eta, self.start))


def _remove(*paths: Path) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _prune_empty(folder: Path, stop: Path) -> None:
    """Removes `folder` and its parents up to and including `stop` while they are empty."""
    folder, stop = folder.absolute(), stop.absolute()
    while folder == stop or stop in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        if folder == stop:
            return
        folder = folder.parent


def _hash_prefix(path: Path, n_bytes: int, cancel: threading.Event | None) -> hashlib._Hash:
    sha = hashlib.sha256()
    with path.open("rb") as src:
        left = n_bytes
        while left > 0:
            if cancel is not None and cancel.is_set():
                raise DownloadCancelled("download cancelled")
            chunk = src.read(min(left, 8 << 20))
            if not chunk:
                break
            sha.update(chunk)
            left -= len(chunk)
    return sha


def download_file(repo: str, hub_file: HubFile, models_folder: Path, *, revision: str = "main",
                  endpoint: str | None = None, on_progress: ProgressCallback | None = None,
                  cancel: threading.Event | None = None, free_space: DiskFree = disk_free,
                  keep_partial_on_cancel: bool = False, max_retries: int = 5,
                  retry_wait_s: float = 1.0, timeout_s: float = 30.0) -> PulledModel:
    """Downloads `hub_file` of `repo` into the models folder and returns where it is. Resumes a partial download of
    the same file (same sha256 and size); raises DiskSpaceError before writing, ChecksumMismatchError (nothing
    kept), DownloadCancelled when `cancel` is set, DownloadInterruptedError after `max_retries` dropped
    connections in a row without a byte (the partial kept), HubUnreachableError when the hub never answered."""
    from filelock import FileLock, Timeout

    endpoint = endpoint or hub_endpoint()
    if not hub_file.sha256:
        raise ModelHubError(f"the hub lists no sha256 for {repo}/{hub_file.path} (not an LFS file), so it could "
                            "not be verified: not downloading it")
    dest = destination(models_folder, repo, hub_file.path)
    part = partial_path(models_folder, repo, hub_file.path)
    note = part.with_name(part.name + ".json")
    size, expected_sha = hub_file.size_bytes, hub_file.sha256.lower()
    if dest.is_file() and dest.stat().st_size == size:
        return PulledModel(dest, repo, hub_file.path, size, None, already_present=True)

    resume_from = 0
    if part.is_file():
        try:
            kept = json.loads(note.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            kept = {}
        on_disk = part.stat().st_size
        if kept.get("sha256") == expected_sha and kept.get("size") == size and on_disk <= size:
            resume_from = on_disk
    needed = size - resume_from
    free = free_space(Path(models_folder))
    if free < needed + SPACE_MARGIN_BYTES:
        raise DiskSpaceError(Path(models_folder), needed, free, SPACE_MARGIN_BYTES)

    part.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(part) + ".lock", timeout=0)
    try:
        lock.acquire()
    except Timeout as exc:
        raise ModelHubError(f"{hub_file.path} is already being downloaded (another window or `pull`); wait for "
                            "it to finish") from exc
    try:
        if resume_from == 0:
            _remove(part)
            note.write_text(json.dumps({"repo": repo, "file": hub_file.path, "sha256": expected_sha, "size": size}),
                            encoding="utf-8")
        try:
            sha = _hash_prefix(part, resume_from, cancel) if resume_from else hashlib.sha256()
            sha = _stream(repo, hub_file, part, sha, resume_from, revision=revision, endpoint=endpoint,
                          on_progress=on_progress, cancel=cancel, max_retries=max_retries,
                          retry_wait_s=retry_wait_s, timeout_s=timeout_s)
        except DownloadCancelled:
            if not keep_partial_on_cancel:
                _remove(part, note)
            raise
        except ChecksumMismatchError:
            _remove(part, note)
            raise
        actual = sha.hexdigest()
        got = part.stat().st_size
        if got != size or actual != expected_sha:
            _remove(part, note)
            if got != size:
                raise ChecksumMismatchError(hub_file.path, f"{size} bytes", f"{got} bytes")
            raise ChecksumMismatchError(hub_file.path, expected_sha, actual)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, dest)
        _remove(note)
    finally:
        lock.release()
        _remove(Path(str(part) + ".lock"))
        _prune_empty(part.parent, Path(models_folder, PARTIAL_FOLDER))
    return PulledModel(dest, repo, hub_file.path, size, actual, resumed_from=resume_from)


def _stream(repo: str, hub_file: HubFile, part: Path, sha: hashlib._Hash, done: int, *, revision: str,
            endpoint: str, on_progress: ProgressCallback | None, cancel: threading.Event | None, max_retries: int,
            retry_wait_s: float, timeout_s: float) -> hashlib._Hash:
    """Appends the bytes after `done` to `part`, reconnecting with a Range after a drop; returns the sha256 of the
    whole file (`sha` holds that of its first `done` bytes)."""
    from huggingface_hub import get_session, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

    url = hf_hub_url(repo, hub_file.path, revision=revision, endpoint=endpoint)
    size, what = hub_file.size_bytes, f"{repo}/{hub_file.path}"
    meter = _Meter(hub_file.path, size, done, on_progress)
    failures, got_bytes, last_error = 0, False, ""
    with part.open("r+b" if part.exists() else "wb") as out:
        out.seek(done)
        out.truncate()
        while done < size:
            if cancel is not None and cancel.is_set():
                raise DownloadCancelled("download cancelled")
            headers = build_hf_headers(headers={"Accept-Encoding": "identity"})
            if done:
                headers["Range"] = f"bytes={done}-"
            try:
                with hub_errors(endpoint, what), get_session().stream(
                        "GET", url, headers=headers, follow_redirects=True, timeout=timeout_s) as response:
                    if response.status_code == 416 and done:       # asked past the end: the server has no more
                        break
                    hf_raise_for_status(response)
                    if done and response.status_code != 206:        # the Range was ignored: start over
                        out.seek(0)
                        out.truncate()
                        sha = hashlib.sha256()
                        done = 0
                    for chunk in response.iter_bytes():     # as they arrive: a drop loses none
                        if cancel is not None and cancel.is_set():
                            raise DownloadCancelled("download cancelled")
                        if done + len(chunk) > size:
                            raise ChecksumMismatchError(hub_file.path, f"{size} bytes", "more bytes")
                        out.write(chunk)
                        sha.update(chunk)
                        done += len(chunk)
                        failures, got_bytes = 0, True
                        meter.update(done)
                    if done < size:            # the body ended early without an error: reconnect for the rest
                        raise ConnectionResetError("the server closed the connection early")
            except (ConnectionResetError, HubUnreachableError) as exc:
                out.flush()
                failures += 1
                last_error = str(exc.__cause__ or exc)
                if failures > max_retries:
                    if not got_bytes and isinstance(exc, HubUnreachableError):
                        raise
                    raise DownloadInterruptedError(
                        f"the download of {hub_file.path} from {endpoint} kept breaking off ({last_error}); "
                        f"{format_bytes(done)} of {format_bytes(size)} is kept: pull it again to resume") from exc
                if cancel is not None:
                    if cancel.wait(retry_wait_s):
                        raise DownloadCancelled("download cancelled") from None
                else:
                    time.sleep(retry_wait_s)
        out.flush()
        os.fsync(out.fileno())
    meter.update(done, force=True)
    return sha


def pull(spec: str, models_folder: Path, *, catalogue: Catalogue | None = None, revision: str = "main",
         endpoint: str | None = None, **download_options) -> PulledModel:
    """`evoke-desk pull SPEC`: resolves `REPO[:QUANT|:FILE]` or a catalogue id against the hub's file list and
    downloads the chosen file (see `download_file` for the options and errors)."""
    endpoint = endpoint or hub_endpoint()
    wanted = parse_spec(spec, catalogue)
    listing = list_gguf_files(wanted.repo, revision, endpoint)
    chosen = choose_file(listing, wanted)
    return download_file(wanted.repo, chosen, models_folder, revision=listing.commit or revision,
                         endpoint=endpoint, **download_options)

