"""KV cache files of one model: `<root>/kv/<model hash>/<conversation id>.<ttl class>.bin`, written
atomically, checked on every read (a digest, see kvheader), expired by TTL class, capped by an LRU budget.

Invariants: a reader gets a complete payload written for this model or None, never damaged bytes;
damaged, foreign, stale and expired files are deleted when met; a conversation's files of other TTL
classes are deleted only after its new file has replaced them; files are 0600 in 0700 folders, and a
failed write is logged with its conversation id. With a disk budget (`set_disk_budget`) every write ends
under it: other models' files go first, then the least recently used (oldest mtime: reads and keep-alive
refresh it), never the file just written (a budget smaller than one file keeps that one). A deleted file
is only a cache: its conversation is rebuilt from history when reopened. One lock serialises this store's calls.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from evoke_engine.store.disk_room import LOCAL_DISK, DiskRoom
from evoke_engine.store.kvheader import (
    HEADER_SIZE,
    InvalidKVFile,
    Payload,
    pack_header,
    validate_header,
    validate_payload,
)
from evoke_engine.store.kvnames import (
    DEFAULT_TTL_SECONDS,
    TTL_CLASSES,
    cache_file_name,
    candidate_names,
    is_model_hash,
    is_temp_file_name,
    parse_cache_file_name,
    parse_ttl_class,
    temp_file_name,
)
from evoke_engine.store.private import FILE_MODE, private_file, private_mkdir
from evoke_engine.store.store_error import DISK_FULL, StoreError, describe_os_error

__all__ = ["DEFAULT_TTL_SECONDS", "TTL_CLASSES", "KVFileStore", "StoreError", "model_hash", "parse_ttl_class"]

log = logging.getLogger(__name__)

_WRITE_CHUNK = 8 << 20
_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)


def model_hash(model_path: str | os.PathLike[str], kv_cache_type: str, n_ctx: int, slots: int,
               flash_attention: str = "on") -> str:
    """16 hex chars of sha256 over the model file's identity (resolved path, size, mtime_ns) and the
    parameters that shape its KV cells (flash attention off stores V transposed); a different model or
    layout gets a different folder."""
    resolved = Path(model_path).resolve()
    try:
        stat = resolved.stat()
    except OSError as error:
        raise describe_os_error("identify the model file", resolved, error) from error
    identity = [str(resolved), stat.st_size, stat.st_mtime_ns, kv_cache_type, int(n_ctx), int(slots)]
    if flash_attention != "on":
        identity.append("v_transposed")
    return hashlib.sha256(json.dumps(identity).encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class _CacheFile:
    path: Path
    size: int
    mtime: float
    mtime_ns: int


def _write_all(fd: int, data: Payload) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view[:_WRITE_CHUNK])
        if written <= 0:
            raise OSError(f"os.write wrote {written} bytes")
        view = view[written:]


def _fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable (POSIX only; Windows cannot open a folder for fsync)."""
    if os.name != "posix":
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as error:
        log.warning("cannot fsync folder %s: %s", directory, error)


def _scan_files(directory: Path) -> Iterator[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as entries:
            yield from entries
    except FileNotFoundError:
        return


class KVFileStore:
    """TTL-tagged KV payloads per conversation for one model hash; see the module docstring."""

    def __init__(self, root: Path, model_hash: str, ttl_seconds: Mapping[str, float] | None = None,
                 clock: Callable[[], float] = time.time, disk_budget_bytes: int | None = None,
                 reserve_bytes: int = 0) -> None:
        if not is_model_hash(model_hash):
            raise ValueError(f"model hash must be 16 lowercase hex characters, got {model_hash!r}")
        ttl = dict(DEFAULT_TTL_SECONDS if ttl_seconds is None else ttl_seconds)
        missing = [ttl_class for ttl_class in TTL_CLASSES if ttl_class not in ttl]
        if missing:
            raise ValueError(f"ttl_seconds lacks TTL classes {missing}; needs all of {list(TTL_CLASSES)}")
        self.model_hash = model_hash
        self.kv_root = Path(root) / "kv"
        self.directory = self.kv_root / model_hash
        self._ttl_seconds = ttl
        self._clock = clock
        self._disk_budget_bytes = disk_budget_bytes       # None: writes are not capped (the sweep still is)
        self.reserve_bytes = reserve_bytes                # free space a write never takes (the chat history's)
        self._room: DiskRoom | None = None                # made with the folder (`_room_for`)
        self._lock = threading.RLock()

    # -- helpers -------------------------------------------------------------------------------------

    @property
    def ttl_seconds(self) -> dict[str, float]:
        """Lifetime of each TTL class in seconds (a copy)."""
        with self._lock:
            return dict(self._ttl_seconds)

    def set_ttl_seconds(self, ttl_seconds: Mapping[str, float]) -> None:
        """Adopt new lifetimes now: reads, `has`, `touch` and sweeps judge expiry by them from here on."""
        ttl = dict(ttl_seconds)
        missing = [ttl_class for ttl_class in TTL_CLASSES if ttl_class not in ttl]
        if missing:
            raise ValueError(f"ttl_seconds lacks TTL classes {missing}; needs all of {list(TTL_CLASSES)}")
        with self._lock:
            self._ttl_seconds = ttl

    @property
    def disk_budget_bytes(self) -> int | None:
        """The cap every write enforces (None: none)."""
        return self._disk_budget_bytes

    def set_disk_budget(self, budget_bytes: int | None) -> list[str]:
        """Adopt a new cap and enforce it now; returns the names of the files it removed."""
        with self._lock:
            self._disk_budget_bytes = budget_bytes
            return [] if budget_bytes is None else self.enforce_disk_budget(budget_bytes)

    def _relative(self, path: Path) -> str:
        return f"{path.parent.name}/{path.name}"

    def _is_expired(self, ttl_class: str, mtime: float, now: float) -> bool:
        return mtime + self._ttl_seconds[ttl_class] < now

    def _unlink(self, path: Path, reason: str, *, warn: bool) -> bool:
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        except OSError as error:
            log.warning("cannot remove KV cache file %s (%s): %s", path, reason, error)
            return False
        (log.warning if warn else log.info)("removed KV cache file %s: %s", self._relative(path), reason)
        return True

    def _files_of(self, conversation_id: str) -> list[_CacheFile]:
        """The conversation's existing files, newest first (normally one; more only after a crash)."""
        found = []
        for name in candidate_names(conversation_id):
            path = self.directory / name
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            except OSError as error:
                log.warning("cannot stat KV cache file %s: %s", path, error)
                continue
            found.append(_CacheFile(path, stat.st_size, stat.st_mtime, stat.st_mtime_ns))
        return sorted(found, key=lambda file: file.mtime_ns, reverse=True)

    def _model_directories(self, all_models: bool) -> list[Path]:
        if not all_models:
            return [self.directory]
        others = [Path(entry.path) for entry in _scan_files(self.kv_root)
                  if entry.is_dir(follow_symlinks=False) and is_model_hash(entry.name)
                  and entry.name != self.model_hash]
        return [self.directory, *sorted(others)]

    def _cache_files_in(self, directory: Path) -> list[_CacheFile]:
        found = []
        for entry in _scan_files(directory):
            if parse_cache_file_name(entry.name) is None or not entry.is_file(follow_symlinks=False):
                continue
            try:
                stat = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            found.append(_CacheFile(Path(entry.path), stat.st_size, stat.st_mtime, stat.st_mtime_ns))
        return found

    def _remove_if_empty(self, directory: Path) -> None:
        if directory == self.directory:
            return
        with contextlib.suppress(OSError):
            directory.rmdir()

    # -- writing -------------------------------------------------------------------------------------

    def _room_for(self, conversation_id: str, final_path: Path, size: int) -> int:
        """What the file adds over the one it replaces, once `DiskRoom` says it fits above `reserve_bytes`; else
        StoreError (disk full), writing nothing: the chat history keeps its room, and a conversation without its
        file is rebuilt from its history when reopened."""
        replaced = 0
        for name in candidate_names(conversation_id):
            with contextlib.suppress(OSError):
                replaced = max(replaced, (self.directory / name).stat().st_size)
        adds = max(0, size - replaced)
        if self._room is None:
            self._room = DiskRoom(self.directory, self.reserve_bytes, LOCAL_DISK)
        if self._room.short(adds):
            log.warning("KV file of conversation %s not written: its %d more bytes would go into the %d kept free "
                        "for the chat history", conversation_id, adds, self.reserve_bytes)
            raise StoreError(f"the disk is nearly full: the KV cache file was not written, to keep "
                             f"{self.reserve_bytes >> 20} MiB free for the chat history (the conversation is rebuilt "
                             "from its history when reopened)", reason=DISK_FULL, path=final_path)
        return adds

    def write(self, conversation_id: str, ttl_class: str, payload: Payload) -> Path:
        """Atomically store `payload` as the conversation's file of `ttl_class` and return its path.

        Raises StoreError (disk full, read-only, ...) with the old file intact and no temp file left.
        """
        final_path = self.directory / cache_file_name(conversation_id, ttl_class)
        header = pack_header(self.model_hash, payload)
        with self._lock:
            try:
                private_mkdir(self.directory)
            except OSError as error:
                log.warning("KV file of conversation %s not written: cannot create %s: %s",
                            conversation_id, self.directory, error)
                raise describe_os_error("create the KV cache folder", self.directory, error) from error
            adds = self._room_for(conversation_id, final_path, len(header) + len(payload))
            temp_path = self.directory / temp_file_name(conversation_id)
            created = False
            with self._room.writing(adds):          # what the disk's reading has not shown yet counts
                try:
                    fd = os.open(temp_path, _OPEN_FLAGS, FILE_MODE)
                    created = True
                    try:
                        _write_all(fd, header)
                        _write_all(fd, payload)
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                    now = self._clock()
                    os.utime(temp_path, (now, now))
                    os.replace(temp_path, final_path)
                except BaseException as error:
                    if created:
                        self._unlink(temp_path, "unfinished write", warn=False)
                    if isinstance(error, OSError):
                        log.warning("KV file of conversation %s not written (%s): %s", conversation_id,
                                    final_path, error)
                        raise describe_os_error("write the KV cache file", final_path, error) from error
                    raise
            _fsync_directory(self.directory)
            for name in candidate_names(conversation_id):
                if name != final_path.name:
                    self._unlink(self.directory / name, f"superseded by {final_path.name}", warn=False)
            if self._disk_budget_bytes is not None:
                self.enforce_disk_budget(self._disk_budget_bytes, keep=final_path)
        return final_path

    # -- reading -------------------------------------------------------------------------------------

    def _read_checked(self, path: Path) -> bytearray | memoryview:
        """The verified payload, writable (K/V splices and re-anchors straight from it). On POSIX it is a
        private copy-on-write map of the file: no zero-fill and no copy, so the read costs the checksum
        alone (64 MB: 37 ms against 80 ms read into a bytearray). Files are only ever replaced by rename,
        never rewritten in place, so the mapped bytes cannot change under the reader. Elsewhere (Windows
        locks a mapped file against replacement) it is read into a bytearray."""
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            header = validate_header(file.read(HEADER_SIZE), size, self.model_hash)
            if os.name == "posix" and header.payload_length:
                mapped = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_COPY)
                payload = memoryview(mapped)[HEADER_SIZE:]
            else:
                payload = bytearray(header.payload_length)
                got = file.readinto(payload)
                payload = payload if got == len(payload) else payload[:got]
        validate_payload(header, payload)
        return payload

    def read(self, conversation_id: str, *, refresh: bool = True) -> bytearray | memoryview | None:
        """The conversation's payload, or None when absent, expired or invalid (those files are removed).

        A hit refreshes the file's mtime to `clock()` (what TTL expiry and the LRU budget use) unless
        `refresh` is False: a reader that may still reject the payload calls `touch` once it is used.
        """
        with self._lock:
            files = self._files_of(conversation_id)
            if not files:
                return None
            newest, stale = files[0], files[1:]
            for file in stale:
                self._unlink(file.path, f"superseded by {newest.path.name}", warn=False)
            now = self._clock()
            if self._is_expired(parse_ttl_class(newest.path.name), newest.mtime, now):
                self._unlink(newest.path, "expired", warn=False)
                return None
            try:
                payload = self._read_checked(newest.path)
            except InvalidKVFile as invalid:
                self._unlink(newest.path, str(invalid), warn=True)
                return None
            except FileNotFoundError:
                return None
            except OSError as error:
                log.warning("cannot read KV cache file %s, treating it as absent: %s", newest.path, error)
                return None
            if not refresh:
                return payload
            try:
                os.utime(newest.path, (now, now))
            except OSError as error:
                log.warning("cannot refresh mtime of KV cache file %s: %s", newest.path, error)
            return payload

    def version(self, conversation_id: str) -> tuple[str, int, int, int] | None:
        """What tells the conversation's newest file apart from any other version of it (name, inode, size,
        mtime_ns: a rewrite, a touch or a removal changes it), or None when it has none. No checksum is read."""
        with self._lock:
            files = self._files_of(conversation_id)
            if not files:
                return None
            try:
                inode = files[0].path.stat().st_ino
            except OSError:
                return None
            return files[0].path.name, inode, files[0].size, files[0].mtime_ns

    def conversations(self) -> list[str]:
        """Ids of this model's conversations with an unexpired file (no checksum is read)."""
        with self._lock:
            now = self._clock()
            found = set()
            for file in self._cache_files_in(self.directory):
                parsed = parse_cache_file_name(file.path.name)
                if parsed is not None and not self._is_expired(parsed[1], file.mtime, now):
                    found.add(parsed[0])
            return sorted(found)

    def peek(self, conversation_id: str, offset: int, length: int) -> bytes | None:
        """Up to `length` payload bytes at `offset` of the conversation's newest unexpired file, its header
        checked (magic, version, model, length) but NOT its digest: for a catalogue whose entries a later `read`
        verifies before any byte is used. None when there is no such file or its header does not check out."""
        with self._lock:
            files = self._files_of(conversation_id)
            if not files or self._is_expired(parse_ttl_class(files[0].path.name), files[0].mtime, self._clock()):
                return None
            try:
                with open(files[0].path, "rb") as file:
                    header = validate_header(file.read(HEADER_SIZE), os.fstat(file.fileno()).st_size,
                                             self.model_hash)
                    if offset < 0 or offset >= header.payload_length:
                        return b""
                    file.seek(HEADER_SIZE + offset)
                    return file.read(min(length, header.payload_length - offset))
            except (InvalidKVFile, OSError):
                return None

    def has(self, conversation_id: str) -> bool:
        """Whether an unexpired file exists for the conversation (no checksum; `read` may still say None)."""
        with self._lock:
            files = self._files_of(conversation_id)
            if not files:
                return False
            return not self._is_expired(parse_ttl_class(files[0].path.name), files[0].mtime, self._clock())

    def touch(self, conversation_id: str) -> bool:
        """Restart the TTL of the conversation's unexpired file (keep-alive); False when there is none."""
        with self._lock:
            files = self._files_of(conversation_id)
            now = self._clock()
            if not files or self._is_expired(parse_ttl_class(files[0].path.name), files[0].mtime, now):
                return False
            try:
                os.utime(files[0].path, (now, now))
            except OSError as error:
                log.warning("cannot refresh mtime of KV cache file %s: %s", files[0].path, error)
                return False
            return True

    def remove(self, conversation_id: str) -> bool:
        """Delete every file of the conversation; False when there was none."""
        with self._lock:
            removed = [self._unlink(file.path, "removed on request", warn=False)
                       for file in self._files_of(conversation_id)]
            return any(removed)

    # -- maintenance ---------------------------------------------------------------------------------

    def sweep_expired(self, max_files: int = 1000, all_models: bool = False) -> list[str]:
        """Delete up to `max_files` expired files (and temp files older than the longest TTL); with
        `all_models` also in sibling model-hash folders, removing those that end up empty.
        Returns the removed names as `<model hash>/<file name>`."""
        removed: list[str] = []
        oldest_temp_age = max(self._ttl_seconds.values())
        with self._lock:
            now = self._clock()
            for directory in self._model_directories(all_models):
                for entry in _scan_files(directory):
                    if len(removed) >= max_files:
                        return removed
                    parsed = parse_cache_file_name(entry.name)
                    if parsed is None and not is_temp_file_name(entry.name):
                        continue
                    try:
                        mtime = entry.stat(follow_symlinks=False).st_mtime
                    except OSError:
                        continue
                    expired = (self._is_expired(parsed[1], mtime, now) if parsed is not None
                               else mtime + oldest_temp_age < now)
                    path = Path(entry.path)
                    if expired and self._unlink(path, "expired", warn=False):
                        removed.append(self._relative(path))
                self._remove_if_empty(directory)
        return removed

    def total_bytes(self, all_models: bool = True) -> int:
        """Bytes in cache files (temp files excluded), across all model folders unless told otherwise."""
        with self._lock:
            return sum(file.size for directory in self._model_directories(all_models)
                       for file in self._cache_files_in(directory))

    def enforce_disk_budget(self, budget_bytes: int, keep: Path | None = None) -> list[str]:
        """Delete files until `total_bytes()` <= budget: other models' files first (this model cannot read
        them), then least recently used (oldest mtime), never `keep`. Returns the removed names."""
        removed: list[str] = []
        with self._lock:
            directories = self._model_directories(all_models=True)
            ranked = sorted(((directory == self.directory, file.mtime_ns, file)
                             for directory in directories for file in self._cache_files_in(directory)),
                            key=lambda item: (item[0], item[1]))
            total = sum(file.size for _, _, file in ranked)
            for _, _, file in ranked:
                if total <= budget_bytes:
                    break
                if file.path == keep:
                    continue
                if self._unlink(file.path, f"over the disk budget of {budget_bytes} bytes", warn=False):
                    total -= file.size
                    removed.append(self._relative(file.path))
            for directory in directories:
                self._remove_if_empty(directory)
        return removed

    def check(self, fix: bool = True) -> list[str]:
        """Start-up check of this model's folder: leftover temp files, unknown names, bad headers (magic,
        version, model, length; no checksum) and stale duplicates. Removes them when `fix`; returns names.
        Call it before writers start: a temp file being written by another process counts as leftover."""
        problems: list[tuple[Path, str]] = []
        newest_of: dict[str, tuple[int, Path]] = {}
        with self._lock:
            if fix:                                     # folders and files from before they were private
                for directory in (self.kv_root, self.directory):
                    if directory.is_dir():
                        private_mkdir(directory)
            for entry in _scan_files(self.directory):
                path = Path(entry.path)
                if entry.is_dir(follow_symlinks=False):
                    log.warning("unexpected folder in the KV cache: %s (left alone)", path)
                    continue
                parsed = parse_cache_file_name(entry.name)
                if is_temp_file_name(entry.name):
                    problems.append((path, "leftover temp file"))
                    continue
                if parsed is None or not entry.is_file(follow_symlinks=False):
                    problems.append((path, "unknown file name"))
                    continue
                try:
                    with open(path, "rb") as file:
                        stat = os.fstat(file.fileno())
                        validate_header(file.read(HEADER_SIZE), stat.st_size, self.model_hash)
                    mtime_ns = stat.st_mtime_ns
                except InvalidKVFile as invalid:
                    problems.append((path, str(invalid)))
                    continue
                except OSError as error:
                    log.warning("cannot check KV cache file %s: %s", path, error)
                    continue
                if fix:
                    private_file(path)
                conversation_id = parsed[0]
                previous = newest_of.get(conversation_id)
                if previous is None or previous[0] < mtime_ns:
                    if previous is not None:
                        problems.append((previous[1], f"superseded by {path.name}"))
                    newest_of[conversation_id] = (mtime_ns, path)
                else:
                    problems.append((path, f"superseded by {previous[1].name}"))
            if fix:
                for path, reason in problems:
                    self._unlink(path, reason, warn=True)
            else:
                for path, reason in problems:
                    log.warning("KV cache file %s: %s", self._relative(path), reason)
        return [self._relative(path) for path, _ in problems]
