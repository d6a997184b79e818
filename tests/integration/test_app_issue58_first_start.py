"""The window's first start (issue 58 item 11), on the embedded model with an empty cache: the chat says what is
being prepared (the recall model, exported once) and that chatting works meanwhile; the status bar marks it until it
is ready; the first message is answered while it is still being prepared, and the notice goes once it is ready.

Invariants: the export really runs (a fresh XDG cache); the reply ends before the recall model is ready."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from integration.test_app_gui import REPLY_MS, close_desk, open_desk, test_settings

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]


def test_the_first_start_says_what_is_prepared_and_the_first_reply_does_not_wait(qapp, qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))        # no exported embedder: a first start's
    home = tmp_path / "home"
    desk = open_desk(home, settings=test_settings(home).replace(embedder=""))     # the bundled embedder
    try:
        chat, status = desk.w.chat, desk.w.status
        qtbot.wait_until(lambda: chat.first_start.isVisible(), timeout=REPLY_MS)
        assert "can chat now" in chat.first_start.text() and "recall model" in chat.first_start.text()
        assert status.recall.isVisible() and "first use" in status.recall.text()
        desk.w.input.prompt.setPlainText("Say hi in three words.")
        with qtbot.wait_signal(desk.c.replyFinished, timeout=REPLY_MS) as finished:
            qtbot.keyClick(desk.w.input.prompt, Qt.Key.Key_Return)
        assert finished.args[0].text.strip()
        assert chat.first_start.isVisible(), "the first reply waited for the recall model"
        qtbot.wait_until(lambda: not chat.first_start.isVisible(), timeout=300_000)
        assert not status.recall.isVisible()
    finally:
        close_desk(desk)
