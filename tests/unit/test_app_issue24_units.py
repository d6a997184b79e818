"""Issue 24 logic without the model: a stopped reply's footer, the history read without a model."""

from __future__ import annotations

import pytest

from app.messages import reply_meta
from evoke_engine.conversations.history_view import read_conversations, read_messages
from evoke_engine.settings import Settings
from evoke_engine.store.history import HistoryDB

pytestmark = pytest.mark.unit      # the unit tier: no model loaded (make test-fast)


def test_a_stopped_reply_with_text_never_shows_zero_tokens():
    meta = reply_meta(0, 0.0, 0.12, "cancelled", streamed_pieces=7)
    assert meta.startswith("7 tokens") and meta.endswith("stopped") and "0 tokens" not in meta
    assert reply_meta(0, 0.0, 0.0, "cancelled") == "stopped"                  # nothing streamed: no count
    assert reply_meta(12, 30.0, 0.2, "eos") == "12 tokens · 30.0 tok/s · first token 0.20 s"
    assert reply_meta(5, 20.0, 0.2, "max_tokens").endswith("· max tokens")


def test_the_history_reads_without_a_model_and_without_writing(tmp_path):
    settings = Settings(home=str(tmp_path))
    assert read_conversations(settings) == [] and read_messages(settings, "nope") == []
    assert not (settings.data_dir / "history.sqlite3").exists()            # reading creates nothing
    history = HistoryDB(settings.data_dir / "history.sqlite3")
    history.create_conversation("a", "First", "", now=10.0)
    history.add_message("a", "user", "hello", [("notes.txt", "port 4003")], now=11.0)
    history.create_conversation("b", "Second", "", settings={"forked_from": "a"}, now=20.0)
    history.close()
    infos = read_conversations(settings)
    assert [(i.id, i.title, i.forked_from) for i in infos] == [("b", "Second", "a"), ("a", "First", None)]
    rows = read_messages(settings, "a")
    assert [(r["role"], r["text"], r["attachments"]) for r in rows] == [("user", "hello", [("notes.txt", "port 4003")])]
    assert read_messages(settings, "unknown") == []
