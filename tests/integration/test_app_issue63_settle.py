"""Issue 63 on the real window and the embedded model (offscreen): at start-up the conversation list and the last
conversation show from SQLite while the model loads; when the conversation finishes opening, the bubbles already
on screen stay the same widgets (a selection in one survives), and `conversationSettled` says when nothing more
will reset the chat view."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QTextCursor

from app.__main__ import build
from app.messages import ChatMessage
from integration.test_app_gui import REPLY_MS, test_settings
from integration.test_app_issue24 import seed_history

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]


def test_the_last_conversation_shows_while_the_model_loads_and_its_bubbles_survive_the_open(qapp, qtbot, tmp_path):
    settings = test_settings(tmp_path)
    seed_history(settings)
    bridge, controller, window = build(settings, (1100, 700))
    window.show()
    settled: list[str] = []
    controller.conversationSettled.connect(settled.append)
    try:
        controller.start()
        qtbot.wait_until(lambda: len(window.chat.bubbles) == 2, timeout=REPLY_MS)
        assert controller.model_state == "loading"                  # read from SQLite, not waiting for the model
        assert window.sidebar.visible_ids() == ["c-new", "c-old"] and window.title.text() == "Rust lifetimes"
        shown = list(window.chat.bubbles)
        reply = shown[1].parts[0]
        cursor = reply.textCursor()
        cursor.select(QTextCursor.SelectionType.Document)
        reply.setTextCursor(cursor)                                   # the user selects the reply to copy it
        selected = reply.textCursor().selectedText()
        assert "reference" in selected
        qtbot.wait_until(lambda: controller.settled, timeout=REPLY_MS)
        assert settled == ["c-new"] and controller.model_state == "ready"
        assert window.chat.bubbles == shown                           # the same widgets, not rebuilt
        assert all(b.message.index == i for i, b in enumerate(shown))   # now with their places in the engine
        assert reply.textCursor().selectedText() == selected          # the selection is still there
    finally:
        window.close()
        bridge.close()


def test_a_reset_keeps_the_bubbles_that_are_right_and_replaces_the_rest(qapp, qtbot, tmp_path):
    from app.widgets.chat_view import ChatView

    view = ChatView()
    first = [ChatMessage("user", "one", created_at=1.0), ChatMessage("assistant", "two", created_at=2.0),
             ChatMessage("user", "three", created_at=3.0)]
    view.reset(first)
    kept = list(view.bubbles)
    second = [first[0], ChatMessage("assistant", "two, edited", created_at=2.0),
              ChatMessage("assistant", "a reply, not a user message", created_at=4.0)]
    view.reset(second)
    assert view.bubbles[:2] == kept[:2]                               # same role: the same widget, updated
    assert view.bubbles[1].source == "two, edited" and view.bubbles[1].text().strip() == "two, edited"
    assert view.bubbles[2] is not kept[2] and view.bubbles[2].role == "assistant"
    view.reset(second[:1])
    assert view.bubbles == kept[:1] and view.bubbles[0].is_last
    view.reset([])
    assert view.bubbles == [] and not view.placeholder.isHidden()
