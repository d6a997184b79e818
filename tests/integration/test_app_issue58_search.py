"""Issue 58 item 15 on the real window (offscreen): the search box says "Search titles and messages", and a
title matches: its conversation is listed (every word, in any order) and heads the hits, and choosing it opens
that conversation."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from evoke_engine.store.history import HistoryDB
from integration.test_app_gui import REPLY_MS, close_desk, open_desk, test_settings

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]


def test_a_title_word_finds_its_conversation_and_opens_it(qapp, qtbot, tmp_path):
    settings = test_settings(tmp_path)
    with HistoryDB(settings.data_dir / "history.sqlite3") as history:
        history.create_conversation("c-k8s", "Kubernetes migration plan", "", now=1000.0)
        history.add_message("c-k8s", "user", "Which cluster goes first?", now=1001.0)
        history.create_conversation("c-new", "Rust lifetimes", "", now=2000.0)
        history.add_message("c-new", "user", "Explain lifetimes briefly.", now=2001.0)
    desk = open_desk(tmp_path, settings=settings)
    try:
        w, c = desk.w, desk.c
        assert c.current_id == "c-new"
        assert "titles" in w.sidebar.search.placeholderText()
        with qtbot.wait_signal(c.searchResults, timeout=30_000, check_params_cb=lambda q, _h: q == "migration kube"):
            qtbot.keyClicks(w.sidebar.search, "migration kube")     # title words, not in its order, none in a message
        results = w.sidebar.hits
        assert [(h.conversation_id, h.is_title) for h in results.hits] == [("c-k8s", True)]
        assert results.summary.text() == "1 title matches"
        assert w.sidebar.visible_titles() == ["Kubernetes migration plan"]
        with qtbot.wait_signal(c.messagesReset, timeout=REPLY_MS):
            rect = results.list.visualItemRect(results.list.item(0))
            qtbot.mouseClick(results.list.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
        assert c.current_id == "c-k8s" and w.title.text() == "Kubernetes migration plan"
    finally:
        close_desk(desk)

