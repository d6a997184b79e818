"""Full-text search of the history (SQLite FTS5) on real SQLite files: live rows only, a reply rewritten while
it streams, hidden and deleted rows, attachment names, odd user input, the migration of an existing file,
and a reply's metrics kept in its row."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest

from evoke_engine import Settings
from evoke_engine.conversations.history_view import search_messages as search_read_only
from evoke_engine.conversations.reply_row import StreamedReply, reply_metrics
from evoke_engine.store import HistoryDB
from evoke_engine.store.history import DELETED, MIGRATIONS, SUPERSEDED
from evoke_engine.store.search import MARK_END, MARK_START, fts_query


@pytest.fixture
def history(tmp_path: Path):
    db = HistoryDB(tmp_path / "history.sqlite3")
    db.create_conversation("c1", "Ports of the service", "", now=1000.0)
    db.create_conversation("c2", "Rust lifetimes", "", now=2000.0)
    yield db
    db.close()


def texts(hits) -> list[str]:
    return [h.plain_snippet for h in hits]


def test_a_word_in_an_old_message_is_found_with_its_conversation_and_the_match_marked(history) -> None:
    history.add_message("c1", "user", "Which port does the service use?", now=1001.0)
    reply = history.add_message("c1", "assistant", "It listens on port 4003, behind the proxy.", now=1002.0)
    history.add_message("c2", "user", "Explain lifetimes briefly.", now=2001.0)
    [hit] = history.search("proxy")
    assert (hit.conversation_id, hit.title, hit.message_id, hit.role, hit.created_at) == (
        "c1", "Ports of the service", reply, "assistant", 1002.0)
    assert f"{MARK_START}proxy{MARK_END}" in hit.snippet
    assert hit.snippet_marked() == "It listens on port 4003, behind the [proxy]."
    assert {h.conversation_id for h in history.search("PORT")} == {"c1"}         # case folded
    assert len(history.search("port")) == 2
    assert texts(history.search("lifet")) == ["Explain lifetimes briefly."]     # the last word is a prefix
    assert history.search("port lifetimes") == []                              # every word must match


def test_attachment_names_are_searched_but_not_their_bodies(history) -> None:
    history.add_message("c1", "user", "Look at this", [("deploy_notes.md", "the secret word is walrus")])
    [hit] = history.search("deploy_notes")
    assert hit.conversation_id == "c1" and "deploy_notes" in hit.plain_snippet
    assert history.search("walrus") == []


def test_a_reply_rewritten_while_it_streams_is_found_once_by_its_final_text(history) -> None:
    clock = iter(range(100))
    row = StreamedReply(history, "c1", clock=lambda: float(next(clock)), interval_s=1.0)
    for piece in ["Draft ", "about ", "kangaroos ", "and more"]:
        row.on_token(piece)
    row.flush()                                                                  # the writer thread's last write
    assert texts(history.search("kangaroos")) == ["Draft about kangaroos and more"]   # searchable while streaming
    row.finish("Final answer about wombats.")
    assert history.search("kangaroos") == []
    [hit] = history.search("wombats")
    assert hit.message_id == row.row_id and not history.messages("c1")[0].interrupted


def test_hidden_and_deleted_rows_are_not_found_and_come_back_with_an_undo(history) -> None:
    old = history.add_message("c1", "assistant", "The old reply mentions zeppelins.")
    history.hide_messages("c1", [old], SUPERSEDED)
    new = history.add_message("c1", "assistant", "The new reply mentions balloons.", previous_id=old)
    assert history.search("zeppelins") == [] and [h.message_id for h in history.search("balloons")] == [new]
    history.hide_messages("c1", [new], DELETED)
    assert history.search("balloons") == []
    history.restore_messages("c1", [new])
    assert [h.message_id for h in history.search("balloons")] == [new]
    history.compact("c1")
    assert history.search("zeppelins") == []
    history.delete("c1")                                                       # the cascade clears the index
    assert history.search("balloons") == []
    with sqlite3.connect(history.path) as raw:
        assert raw.execute("SELECT count(*) FROM message_search").fetchone() == (0,)


@pytest.mark.parametrize("odd", ['"foo', "a AND", "AND", "OR NOT", "*", "(", ")", "NEAR(", "col:x", '""', "-",
                                 "^", "text:port", "a OR b", "'", "port*)", "   ", "", "\x00", "😀", "a" * 5000])
def test_odd_user_input_never_raises(history, odd) -> None:
    history.add_message("c1", "user", "Which port does the service use?")
    hits = history.search(odd)
    assert isinstance(hits, list)


def test_quotes_and_operators_are_searched_as_text(history) -> None:
    history.add_message("c1", "user", "Which port does the service use?")
    history.add_message("c1", "user", "cats AND dogs")
    assert len(history.search('"port')) == 1 and len(history.search('port"')) == 1
    assert texts(history.search("AND dogs")) == ["cats AND dogs"]              # AND is a word here, not an operator
    assert fts_query('say "hi" AND *') == '"say" """hi""" "AND"*'
    assert fts_query("  ") is None and fts_query("* ( )") is None


def test_an_existing_v2_file_is_indexed_by_the_migration(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as raw:
        for migrate in MIGRATIONS[:2]:
            migrate(raw)
        raw.execute("PRAGMA user_version = 2")
        raw.execute("INSERT INTO conversations VALUES ('c1', 'Old', 1, 1, 0, '', '{}')")
        raw.execute("INSERT INTO messages (conversation_id, role, text, attachments_json, created_at) "
                    "VALUES ('c1', 'user', 'an old note about gazelles', '[[\"zoo.txt\", \"body\"]]', 1)")
        raw.execute("INSERT INTO messages (conversation_id, role, text, created_at, status) "
                    "VALUES ('c1', 'assistant', 'a hidden reply about gazelles', 2, 'superseded')")
        raw.execute("INSERT INTO messages (conversation_id, role, text, attachments_json, created_at) "
                    "VALUES ('c1', 'user', 'bad attachments json', 'not json', 3)")
    with HistoryDB(path) as db:
        assert db.schema_version == len(MIGRATIONS) == 3
        assert texts(db.search("gazelles")) == ["an old note about gazelles"]
        assert [h.conversation_id for h in db.search("zoo")] == ["c1"]
        assert texts(db.search("attachments")) == ["bad attachments json"]
    settings = Settings(home=str(tmp_path / "home"))
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    path.rename(settings.data_dir / "history.sqlite3")
    assert texts(search_read_only(settings, "gazelles")) == ["an old note about gazelles"]   # without an engine


def test_a_finished_reply_keeps_its_metrics_in_its_row(history) -> None:
    """Unrounded: the footer after a restart formats the stored figure (a rounded 37.95 read 38.0 where the live
    footer read 37.9)."""
    row = StreamedReply(history, "c1")
    row.on_token("Hello")
    reply = SimpleNamespace(n_tokens=12, tokens_per_s=37.94999, ttft_s=0.16449, stopped="eos")
    row.finish("Hello there.", reply_metrics(reply))
    [stored] = history.messages("c1")
    assert stored.extra == {"metrics": {"tokens": 12, "tokens_per_s": 37.94999, "ttft_s": 0.16449, "stopped": "eos"}}
    assert not stored.interrupted
