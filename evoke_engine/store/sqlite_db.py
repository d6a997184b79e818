"""A small SQLite wrapper: one connection shared by threads behind a lock, WAL, foreign keys on,
`PRAGMA user_version` migrations and a transaction context manager (qutebrowser's Database/Transaction).

Invariants: every statement runs under the lock; `user_version` == number of applied migrations;
environment failures surface as `StoreError`, SQL and other programming errors keep their sqlite3 types;
the database file (and so its -wal and -shm) is 0600 in a 0700 folder.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from evoke_engine.store.private import create_private, private_file, private_mkdir
from evoke_engine.store.store_error import (
    CANNOT_OPEN,
    CORRUPT,
    DISK_FULL,
    IO,
    LOCKED,
    NEWER_SCHEMA,
    OUT_OF_MEMORY,
    PERMISSION,
    READ_ONLY,
    StoreError,
    describe_os_error,
)

log = logging.getLogger(__name__)

Migration = Callable[[sqlite3.Connection], None]

_REASON_OF_PRIMARY_CODE = {
    sqlite3.SQLITE_BUSY: LOCKED,
    sqlite3.SQLITE_LOCKED: LOCKED,
    sqlite3.SQLITE_PROTOCOL: LOCKED,
    sqlite3.SQLITE_READONLY: READ_ONLY,
    sqlite3.SQLITE_PERM: PERMISSION,
    sqlite3.SQLITE_IOERR: IO,
    sqlite3.SQLITE_CORRUPT: CORRUPT,
    sqlite3.SQLITE_NOTADB: CORRUPT,
    sqlite3.SQLITE_FULL: DISK_FULL,
    sqlite3.SQLITE_CANTOPEN: CANNOT_OPEN,
    sqlite3.SQLITE_NOMEM: OUT_OF_MEMORY,
}


def translate_sqlite_error(error: sqlite3.Error, path: Path) -> StoreError | None:
    """The StoreError for an environment failure, or None when `error` is a programming error."""
    code = getattr(error, "sqlite_errorcode", None)
    reason = _REASON_OF_PRIMARY_CODE.get(code & 0xFF) if isinstance(code, int) else None
    if reason is None:
        return None
    what = {
        LOCKED: f"the database {path} is locked by another program or thread",
        READ_ONLY: f"the database {path} is read-only",
        PERMISSION: f"no permission to use the database {path}",
        IO: f"I/O error on the database {path}",
        CORRUPT: (f"the database {path} is damaged or is not a SQLite database; "
                  "move it aside to start a new one"),
        DISK_FULL: f"the disk is full: cannot write the database {path}",
        CANNOT_OPEN: f"cannot open the database {path} (missing folder or no permission)",
        OUT_OF_MEMORY: f"out of memory while using the database {path}",
    }[reason]
    return StoreError(f"{what} ({error})", reason=reason, path=path)


def _make_private(path: Path) -> None:
    """The database file exists as 0600 before SQLite opens it (SQLite would create it 0644 less the umask;
    its -wal and -shm files take the database file's mode). Files from before this rule are narrowed."""
    try:
        os.close(create_private(path))
    except FileExistsError:
        for suffix in ("", "-wal", "-shm", "-journal"):
            private_file(path.with_name(path.name + suffix))


class Database:
    """One SQLite connection usable from several threads; see the module docstring for invariants."""

    def __init__(self, path: Path, migrations: Sequence[Migration], *, busy_timeout_s: float = 5.0,
                 read_only: bool = False) -> None:
        self.path = Path(path)
        self._migrations = tuple(migrations)
        self._lock = threading.RLock()
        self._transaction_depth = 0
        self._conn: sqlite3.Connection | None = None
        if not read_only:
            try:
                private_mkdir(self.path.parent)
            except OSError as error:
                raise describe_os_error("create the folder of", self.path, error) from error
            try:
                _make_private(self.path)
            except OSError as error:
                raise describe_os_error("create the database", self.path, error) from error
        with self._translated():
            target = f"{self.path.resolve().as_uri()}?mode=ro" if read_only else str(self.path)
            conn = sqlite3.connect(target, uri=read_only, timeout=busy_timeout_s,
                                   check_same_thread=False, isolation_level=None)
            try:
                self._conn = conn
                self._configure(read_only)
                self._migrate(read_only)
            except BaseException:
                self._conn = None
                conn.close()
                raise

    @property
    def connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise sqlite3.ProgrammingError(f"database {self.path} is closed")
        return self._conn

    def _configure(self, read_only: bool) -> None:
        conn = self.connection
        conn.execute("PRAGMA foreign_keys = ON")
        if read_only:
            return
        (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
        if str(mode).lower() != "wal":
            log.warning("database %s: WAL not available (journal_mode=%s)", self.path, mode)
        conn.execute("PRAGMA synchronous = FULL")

    def _migrate(self, read_only: bool) -> None:
        version = self.schema_version
        latest = len(self._migrations)
        if version > latest:
            raise StoreError(f"the database {self.path} was written by a newer version of this app "
                             f"(schema {version}, this build knows up to {latest})",
                             reason=NEWER_SCHEMA, path=self.path)
        if version < latest and read_only:
            raise StoreError(f"the database {self.path} needs an upgrade from schema {version} to {latest} "
                             "but was opened read-only", reason=READ_ONLY, path=self.path)
        for index in range(version, latest):
            with self.transaction() as conn:
                self._migrations[index](conn)
                conn.execute(f"PRAGMA user_version = {index + 1:d}")
            log.info("database %s migrated to schema %d", self.path, index + 1)

    @property
    def schema_version(self) -> int:
        with self.reading() as conn:
            (version,) = conn.execute("PRAGMA user_version").fetchone()
        return int(version)

    @contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as error:
            store_error = translate_sqlite_error(error, self.path)
            if store_error is None:
                raise
            raise store_error from error

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """The connection under the lock, for reads (autocommit); environment errors become StoreError."""
        with self._lock, self._translated():
            yield self.connection

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception; a nested call joins the outer one."""
        with self._lock:
            if self._transaction_depth:
                self._transaction_depth += 1
                try:
                    yield self.connection
                finally:
                    self._transaction_depth -= 1
                return
            with self._translated():
                conn = self.connection
                conn.execute("BEGIN IMMEDIATE")
                self._transaction_depth = 1
                try:
                    yield conn
                    conn.execute("COMMIT")
                except BaseException:
                    self._rollback_quietly(conn)
                    raise
                finally:
                    self._transaction_depth = 0

    def _rollback_quietly(self, conn: sqlite3.Connection) -> None:
        if not conn.in_transaction:
            return
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error as error:
            log.warning("database %s: rollback failed: %s", self.path, error)

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
