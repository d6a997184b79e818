"""HistoryDB on real SQLite files in tmp_path: CRUD, ordering, search, cascade, migrations, WAL, threads,
and environment failures (read-only, locked, full, damaged) surfacing as StoreError."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from evoke_engine.store import HistoryDB, StoreError
from evoke_engine.store import store_error as reasons
from evoke_engine.store.history import MIGRATIONS

pytestmark = pytest.mark.unit      # the unit tier: no model loaded (make test-fast)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "history" / "chat.sqlite3"


@pytest.fixture
def history(db_path: Path) -> Iterator[HistoryDB]:
    db = HistoryDB(db_path)
    yield db
    db.close()


def test_create_get_and_row_fields(history: HistoryDB) -> None:
    row = history.create_conversation("c1", "First", "be brief", settings={"temperature": 0.2}, now=100.0)
    assert history.get_conversation("c1") == row
    assert row.created_at == row.updated_at == 100.0
    assert row.pinned is False and row.settings == {"temperature": 0.2} and row.system_prompt == "be brief"
    assert history.get_conversation("missing") is None


def test_duplicate_id_is_a_programming_error(history: HistoryDB) -> None:
    history.create_conversation("c1", "A", "")
    with pytest.raises(sqlite3.IntegrityError):
        history.create_conversation("c1", "B", "")


def test_rename_pin_settings_touch(history: HistoryDB) -> None:
    history.create_conversation("c1", "Old", "", now=1.0)
    history.rename("c1", "New")
    history.set_pinned("c1", True)
    history.set_settings("c1", {"n_ctx": 4096, "nested": {"a": [1, 2]}})
    history.touch("c1", now=50.0)
    row = history.get_conversation("c1")
    assert row is not None
    assert (row.title, row.pinned, row.settings, row.updated_at) == (
        "New", True, {"n_ctx": 4096, "nested": {"a": [1, 2]}}, 50.0)
    history.set_pinned("c1", False)
    assert history.get_conversation("c1").pinned is False  # type: ignore[union-attr]


@pytest.mark.parametrize("call", [
    lambda db: db.rename("nope", "x"),
    lambda db: db.set_pinned("nope", True),
    lambda db: db.set_settings("nope", {}),
    lambda db: db.touch("nope"),
    lambda db: db.add_message("nope", "user", "hi"),
])
def test_unknown_conversation_raises_key_error(history: HistoryDB,
                                               call: Callable[[HistoryDB], object]) -> None:
    with pytest.raises(KeyError):
        call(history)
    assert history.messages("nope") == []


def test_messages_in_order_with_attachments_and_updated_at_bump(history: HistoryDB) -> None:
    history.create_conversation("c1", "T", "", now=1.0)
    first = history.add_message("c1", "user", "look at this", [("app.py", "print('hi')\n")], now=2.0)
    second = history.add_message("c1", "assistant", "looks fine", now=3.0)
    assert second > first
    rows = history.messages("c1")
    assert [(r.id, r.role, r.text, r.attachments, r.created_at) for r in rows] == [
        (first, "user", "look at this", [("app.py", "print('hi')\n")], 2.0),
        (second, "assistant", "looks fine", [], 3.0),
    ]
    assert history.get_conversation("c1").updated_at == 3.0  # type: ignore[union-attr]


def test_list_orders_by_updated_at_desc(history: HistoryDB) -> None:
    for index, conversation_id in enumerate(["a", "b", "c"]):
        history.create_conversation(conversation_id, conversation_id.upper(), "", now=float(index))
    history.add_message("a", "user", "bump", now=10.0)
    assert [row.id for row in history.list_conversations()] == ["a", "c", "b"]


def test_search_is_case_insensitive_substring_of_title(history: HistoryDB) -> None:
    history.create_conversation("1", "Refactor the Parser", "", now=1.0)
    history.create_conversation("2", "parser tests", "", now=2.0)
    history.create_conversation("3", "Straße und ÄPFEL", "", now=3.0)
    history.create_conversation("4", "100% done_ok", "", now=4.0)
    assert [row.id for row in history.list_conversations("PARSER")] == ["2", "1"]
    assert [row.id for row in history.list_conversations("äpfel")] == ["3"]
    assert [row.id for row in history.list_conversations("%")] == ["4"]  # no LIKE wildcards
    assert [row.id for row in history.list_conversations("_")] == ["4"]
    assert history.list_conversations("nothing like it") == []
    assert len(history.list_conversations("")) == 4


def test_delete_cascades_to_messages(history: HistoryDB) -> None:
    history.create_conversation("c1", "T", "")
    history.create_conversation("c2", "U", "")
    history.add_message("c1", "user", "one")
    history.add_message("c2", "user", "two")
    assert history.delete("c1") is True
    assert history.delete("c1") is False
    assert history.messages("c1") == []
    assert [m.text for m in history.messages("c2")] == ["two"]
    with sqlite3.connect(history.path) as raw:
        assert raw.execute("SELECT count(*) FROM messages").fetchone() == (1,)


def test_transaction_groups_calls_and_rolls_back(history: HistoryDB) -> None:
    history.create_conversation("c1", "T", "")
    with pytest.raises(RuntimeError), history.transaction():
        history.add_message("c1", "user", "kept?")
        history.rename("c1", "renamed")
        raise RuntimeError("boom")
    assert history.messages("c1") == []
    assert history.get_conversation("c1").title == "T"  # type: ignore[union-attr]


def test_fresh_file_migrates_to_latest_with_wal_and_reopens(db_path: Path) -> None:
    with HistoryDB(db_path) as db:
        assert db.schema_version == len(MIGRATIONS) == 3
        db.create_conversation("c1", "Kept", "sys")
        db.add_message("c1", "user", "hello")
    with sqlite3.connect(db_path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert raw.execute("PRAGMA user_version").fetchone() == (3,)
    with HistoryDB(db_path) as db:
        assert db.schema_version == 3
        assert [m.text for m in db.messages("c1")] == ["hello"]
        assert db._db.connection.execute("PRAGMA foreign_keys").fetchone() == (1,)


def test_empty_existing_file_is_migrated(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(b"")
    with HistoryDB(db_path) as db:
        assert db.schema_version == 3
        db.create_conversation("c1", "T", "")


def test_newer_schema_is_refused(db_path: Path) -> None:
    HistoryDB(db_path).close()
    with sqlite3.connect(db_path) as raw:
        raw.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreError, match="newer version") as caught:
        HistoryDB(db_path)
    assert caught.value.reason == reasons.NEWER_SCHEMA


def test_threads_share_one_instance(history: HistoryDB) -> None:
    history.create_conversation("c1", "T", "")
    errors: list[BaseException] = []

    def writer(thread_index: int) -> None:
        try:
            for index in range(50):
                history.add_message("c1", "user", f"{thread_index}:{index}")
                history.list_conversations("t")
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    texts = [m.text for m in history.messages("c1")]
    assert len(texts) == len(set(texts)) == 400


def test_read_only_database_raises_store_error_on_write(db_path: Path) -> None:
    HistoryDB(db_path).close()
    with HistoryDB(db_path, read_only=True) as db:
        assert db.list_conversations() == []
        with pytest.raises(StoreError, match="read-only") as caught:
            db.create_conversation("c1", "T", "")
    assert caught.value.reason == reasons.READ_ONLY


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root ignores file permissions")
def test_read_only_file_raises_store_error(db_path: Path) -> None:
    with HistoryDB(db_path) as db:
        db.create_conversation("c1", "T", "")
    for path in db_path.parent.iterdir():
        path.chmod(0o444)
    db_path.parent.chmod(0o555)
    try:
        with pytest.raises(StoreError):
            db = HistoryDB(db_path)
            db.add_message("c1", "user", "x")
    finally:
        db_path.parent.chmod(0o755)


def test_locked_database_raises_store_error(db_path: Path) -> None:
    with HistoryDB(db_path, busy_timeout_s=0.05) as db:
        db.create_conversation("c1", "T", "")
        other = sqlite3.connect(db_path, isolation_level=None)
        try:
            other.execute("BEGIN EXCLUSIVE")
            with pytest.raises(StoreError, match="locked") as caught:
                db.add_message("c1", "user", "blocked")
            assert caught.value.reason == reasons.LOCKED
            other.execute("ROLLBACK")
        finally:
            other.close()
        db.add_message("c1", "user", "after")
        assert [m.text for m in db.messages("c1")] == ["after"]


def test_full_database_raises_store_error_and_keeps_earlier_rows(history: HistoryDB) -> None:
    history.create_conversation("c1", "T", "")
    history.add_message("c1", "user", "before")
    (pages,) = history._db.connection.execute("PRAGMA page_count").fetchone()
    history._db.connection.execute(f"PRAGMA max_page_count = {pages + 2}")  # fault injection: a full disk
    with pytest.raises(StoreError, match="disk is full") as caught:
        history.add_message("c1", "user", "x" * 100_000)
    assert caught.value.reason == reasons.DISK_FULL
    assert [m.text for m in history.messages("c1")] == ["before"]
    assert history.get_conversation("c1") is not None


def test_garbage_file_is_reported_as_corrupt(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(b"this is not a database, just some text that landed here\n" * 100)
    with pytest.raises(StoreError, match="damaged or is not a SQLite database") as caught:
        HistoryDB(db_path)
    assert caught.value.reason == reasons.CORRUPT
    assert db_path.read_bytes().startswith(b"this is not a database")  # the file is never deleted


def test_damaged_pages_are_reported_as_corrupt(db_path: Path) -> None:
    with HistoryDB(db_path) as db:
        db.create_conversation("c1", "T", "")
        for index in range(300):
            db.add_message("c1", "user", f"message {index} " + "x" * 200)
    with sqlite3.connect(db_path) as raw:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (page_size,) = raw.execute("PRAGMA page_size").fetchone()
    with open(db_path, "r+b") as file:
        file.seek(page_size)  # everything after the first page: schema root stays, tables are garbage
        size = db_path.stat().st_size - page_size
        file.write(bytes((index * 37 + 11) % 256 for index in range(size)))
    with pytest.raises(StoreError) as caught, HistoryDB(db_path) as db:
        db.messages("c1")
        db.list_conversations()
    assert caught.value.reason == reasons.CORRUPT


def test_programming_errors_are_not_store_errors(history: HistoryDB) -> None:
    with pytest.raises(sqlite3.OperationalError), history.transaction() as conn:
        conn.execute("SELECT no_such_column FROM conversations")
    with pytest.raises(TypeError):
        history.set_settings("x", {"bad": object()})


def test_store_error_is_an_engine_error() -> None:
    from evoke_engine.errors import EvokeError

    assert issubclass(StoreError, EvokeError)


def test_v1_file_migrates_and_keeps_its_messages_live(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    with sqlite3.connect(db_path) as raw:
        MIGRATIONS[0](raw)
        raw.execute("INSERT INTO conversations VALUES ('c1', 'Old', 1, 1, 0, '', '{}')")
        raw.execute("INSERT INTO messages (conversation_id, role, text, created_at) VALUES ('c1', 'user', 'hi', 1)")
        raw.execute("PRAGMA user_version = 1")
    with HistoryDB(db_path) as db:
        assert db.schema_version == 3
        [row] = db.messages("c1")
        assert (row.text, row.status, row.previous_id) == ("hi", "live", None)


def test_hidden_messages_leave_the_live_history_until_compacted(history: HistoryDB) -> None:
    history.create_conversation("c1", "T", "")
    first = history.add_message("c1", "user", "one")
    reply = history.add_message("c1", "assistant", "two")
    history.hide_messages("c1", [reply], "superseded")
    again = history.add_message("c1", "assistant", "two, again", previous_id=reply)
    assert [m.text for m in history.messages("c1")] == ["one", "two, again"]
    every = history.messages("c1", include_hidden=True)
    assert [(m.id, m.status) for m in every] == [(first, "live"), (reply, "superseded"), (again, "live")]
    assert every[-1].previous_id == reply
    history.restore_messages("c1", [reply])
    assert [m.text for m in history.messages("c1")] == ["one", "two", "two, again"]
    history.hide_messages("c1", [first], "deleted")
    assert history.compact("c1") == 1
    assert [m.text for m in history.messages("c1", include_hidden=True)] == ["two", "two, again"]
    with pytest.raises(ValueError):
        history.hide_messages("c1", [reply], "gone")
