"""Issue 24's history features on the real window and the embedded model (offscreen): Ctrl+F searches message
text and opens a hit at its message, bubble times, the copy feedback, and after a restart the last
conversation reopens with each reply's speed footer."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication

from app.messages import reply_meta, stamp_text
from app.widgets.search_box import hit_html
from evoke_engine.store.history import HistoryDB
from integration.test_app_gui import REPLY_MS, close_desk, fresh_conversation, open_desk, send_and_wait, test_settings

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]
# docs/screenshots/message-search.png is refreshed only on request (EVOKE_SCREENSHOTS=1)
SCREENSHOT = (Path(__file__).resolve().parents[2] / "docs" / "screenshots" if os.environ.get("EVOKE_SCREENSHOTS")
              else Path(tempfile.gettempdir()) / "evoke-screenshots") / "message-search.png"
OLD = time.time() - 3 * 86400                    # the old conversation was written three days ago
METRICS = {"tokens": 21, "tokens_per_s": 31.4, "ttft_s": 0.18, "stopped": "eos"}


def seed_history(settings) -> None:
    """An old conversation, long enough to scroll, with a rare word early on; a newer one, opened at start."""
    history = HistoryDB(settings.data_dir / "history.sqlite3")
    try:
        history.create_conversation("c-old", "Trip planning", "", now=OLD)
        for i in range(12):
            ask = "Which island is Zanzibar's capital on?" if i == 1 else f"Question {i} about the itinerary."
            history.add_message("c-old", "user", ask, now=OLD + 10 * i)
            history.add_message("c-old", "assistant", f"Answer {i}: book the ferry early.", now=OLD + 10 * i + 5,
                                extra={"metrics": METRICS})
        history.create_conversation("c-new", "Rust lifetimes", "", now=OLD + 3600)
        history.add_message("c-new", "user", "Explain lifetimes briefly.", now=OLD + 3601)
        history.add_message("c-new", "assistant", "They say how long a reference is valid.", now=OLD + 3602)
    finally:
        history.close()


@pytest.fixture(scope="module")
def desk(qapp, tmp_path_factory):
    home = tmp_path_factory.mktemp("history-features-home")
    seed_history(test_settings(home))
    desk = open_desk(home)
    yield desk
    close_desk(desk)


def in_view(chat, bubble) -> bool:
    top = bubble.mapTo(chat.viewport(), QPoint(0, 0)).y()
    return bubble.isVisible() and -bubble.height() < top < chat.viewport().height()


def test_ctrl_f_finds_a_word_of_an_old_message_and_opens_its_conversation_at_that_message(desk, qtbot):
    w, c = desk.w, desk.c
    assert c.current_id == "c-new"                             # the newest: nothing was opened before
    w.activateWindow()
    qtbot.keyClick(w.input.prompt, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
    qtbot.wait_until(lambda: QApplication.focusWidget() is w.sidebar.search)
    with qtbot.wait_signal(c.searchResults, timeout=30_000, check_params_cb=lambda q, _hits: q == "zanzib"):
        qtbot.keyClicks(w.sidebar.search, "zanzib")            # a prefix of a word in the message text
    results = w.sidebar.hits
    assert results.isVisible() and [h.conversation_id for h in results.hits] == ["c-old"]
    assert "<b" in hit_html(results.hits[0]) and "Trip planning" in hit_html(results.hits[0])
    assert w.sidebar.visible_titles() == []                    # no title holds it: only the message search finds it
    qtbot.wait_until(lambda: results.list.visualItemRect(results.list.item(0)).height() > 0)
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    w.grab().save(str(SCREENSHOT))
    with qtbot.wait_signal(c.messageRevealed, timeout=REPLY_MS) as revealed:
        rect = results.list.visualItemRect(results.list.item(0))
        qtbot.mouseClick(results.list.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert c.current_id == "c-old" and w.title.text() == "Trip planning"
    position = revealed.args[0]
    bubble = w.chat.bubbles[position]
    assert position == 2 and "Zanzibar" in bubble.text()
    qtbot.wait_until(lambda: in_view(w.chat, bubble) and not in_view(w.chat, w.chat.bubbles[-1]))
    w.sidebar.search.clear()
    assert not results.isVisible()


def test_bubbles_show_when_each_message_was_written_and_stored_replies_their_speed(desk, qtbot):
    c, chat = desk.c, desk.w.chat
    if c.current_id != "c-old":
        with qtbot.wait_signal(c.messagesReset, timeout=REPLY_MS):
            c.open_conversation("c-old")
    first, reply = chat.bubbles[0], chat.bubbles[1]
    assert first.stamp.text() == f"·  {stamp_text(OLD)}" and ":" in first.stamp.text()
    assert " " in stamp_text(OLD)                              # not today: the date is shown
    assert reply.footer.text() == reply_meta(21, 31.4, 0.18, "eos") == "21 tokens · 31.4 tok/s · first token 0.18 s"
    fresh_conversation(desk, qtbot)
    reply = send_and_wait(desk, qtbot, "Say hello.")
    assert reply.text.strip()
    now = stamp_text(time.time())
    assert [b.stamp.text() for b in chat.bubbles] == [f"·  {now}"] * 2    # written today: the time only


def test_the_copy_button_says_copied_then_goes_back(desk, qtbot):
    chat = desk.w.chat
    if not chat.bubbles:
        send_and_wait(desk, qtbot, "Say hello.")
    bubble = chat.bubbles[0]
    bubble.show_actions(True)
    button = bubble.buttons["copy"]
    with qtbot.wait_signal(chat.messageCopied):
        qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    assert button.text() == "Copied ✓"
    assert QGuiApplication.clipboard().text() == bubble.source
    qtbot.wait_until(lambda: button.text() == "Copy")


def test_after_a_restart_the_last_conversation_reopens_with_its_reply_speed(qapp, qtbot, tmp_path):
    desk = open_desk(tmp_path)
    try:
        first = desk.c.current_id
        reply = send_and_wait(desk, qtbot, "Name a primary color.")
        assert reply.meta and "tokens" in reply.meta
        fresh_conversation(desk, qtbot)                        # a newer conversation, listed first
        with qtbot.wait_signal(desk.c.messagesReset, timeout=REPLY_MS):
            desk.c.open_conversation(first)                    # the last one shown
        assert desk.c.conversations.rows[0].id != first
    finally:
        close_desk(desk)
    desk = open_desk(tmp_path)
    try:
        assert desk.c.current_id == first
        qtbot.wait_until(lambda: len(desk.w.chat.bubbles) == 2)
        assert desk.w.chat.bubbles[-1].footer.text() == reply.meta
    finally:
        close_desk(desk)
