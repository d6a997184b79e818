"""Issue 58 item 15: the search box says "Search titles and messages", so a conversation's title matches like a
message does: every word, in any order, ignoring case; on real SQLite files (the engine's store and the
read-only reader the window uses without an engine) and on the widgets' plain helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

from evoke_engine import Settings
from evoke_engine.conversations.history_view import search_messages as search_read_only
from evoke_engine.store import HistoryDB
from evoke_engine.store.search import MARK_END, MARK_START, TITLE_ROLE, mark_title

pytestmark = pytest.mark.unit      # the unit tier: no model loaded (make test-fast)


@pytest.fixture
def history(tmp_path: Path):
    db = HistoryDB(tmp_path / "history.sqlite3")
    db.create_conversation("c1", "Kubernetes migration plan", "", now=1000.0)
    db.create_conversation("c2", "Rust lifetimes", "", now=2000.0)
    db.add_message("c1", "user", "Which cluster first?", now=1001.0)
    db.add_message("c2", "user", "Explain the migration of borrowed values.", now=2001.0)
    yield db
    db.close()


def test_a_title_holding_every_word_is_a_hit_before_the_messages(history) -> None:
    hits = history.search("MIGRATION kube", titles=True)        # any order, any case, a word inside the title
    assert [(h.conversation_id, h.role, h.message_id) for h in hits] == [("c1", TITLE_ROLE, 0)]
    [title] = hits
    assert title.is_title and title.title == "Kubernetes migration plan" and title.created_at >= 1000.0
    assert title.snippet_marked() == "[Kube]rnetes [migration] plan"
    hits = history.search("migration", titles=True)             # the title first, then the message
    assert [(h.conversation_id, h.is_title) for h in hits] == [("c1", True), ("c2", False)]
    assert history.search("migration", titles=True, limit=1) == hits[:1]      # `limit` hits in all
    assert history.search("kubernetes rust", titles=True) == []              # every word must be in one title


def test_without_titles_the_store_search_stays_messages_only(history) -> None:
    assert [h.conversation_id for h in history.search("migration")] == ["c2"]


def test_the_read_only_reader_the_window_uses_without_an_engine_finds_titles(tmp_path: Path) -> None:
    settings = Settings(home=str(tmp_path / "home"))
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    with HistoryDB(settings.data_dir / "history.sqlite3") as db:
        db.create_conversation("c1", "Deploy checklist", "", now=1.0)
    [hit] = search_read_only(settings, "checklist")
    assert hit.is_title and hit.conversation_id == "c1"


@pytest.mark.parametrize(("title", "terms", "marked"), [
    ("Ports of the service", ["port"], "[Port]s of the service"),
    ("Kubernetes", ["kube", "bern"], "[Kubern]etes"),        # overlapping matches merge into one mark
    ("Straße plan", ["plan"], "Straße plan"),                  # casefold changes the length: found, not marked
    ("Rust", ["go"], None),
])
def test_marking_a_title(title, terms, marked) -> None:
    result = mark_title(title, terms)
    assert (None if result is None else result.replace(MARK_START, "[").replace(MARK_END, "]")) == marked


def test_the_hit_list_says_titles_and_messages(tmp_path: Path) -> None:
    from app.widgets.search_box import hit_html, summary_text

    with HistoryDB(tmp_path / "history.sqlite3") as db:
        db.create_conversation("c1", "Kubernetes <plan>", "", now=1.0)
        db.add_message("c1", "user", "the plan is ready", now=2.0)
        hits = db.search("plan", titles=True)
    assert summary_text(hits) == "1 title and 1 message match"
    assert summary_text(hits[:1]) == "1 title matches" and summary_text([]) == "No title or message matches"
    assert "Conversation title" in hit_html(hits[0]) and "&lt;" in hit_html(hits[0])
