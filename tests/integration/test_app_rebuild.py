"""A conversation rebuilt from its history (an import: no KV file fits it) says so in the chat and the status
bar while it happens, on the real window and the embedded model (offscreen); the notice goes when it is done."""

from __future__ import annotations

import pytest

from evoke_engine.conversations.exchange import FORMAT_NAME, FORMAT_VERSION
from integration.test_app_gui import REPLY_MS, close_desk, open_desk, test_settings

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]


def test_a_rebuild_from_history_shows_its_progress_in_the_chat_and_the_status_bar(qapp, qtbot, tmp_path):
    desk = open_desk(tmp_path, settings=test_settings(tmp_path).replace(block_tokens=64))
    try:
        lines = "\n".join(f"line {i}: the service on host {i} listens on port {4000 + i}." for i in range(40))
        conv = desk.c.engine.import_conversation({
            "format": FORMAT_NAME, "version": FORMAT_VERSION, "title": "Imported ports", "system_prompt": "",
            "tools": [], "messages": [{"role": "user", "text": "Here are the ports:\n" + lines},
                                      {"role": "assistant", "text": "Noted, all forty of them."}]})
        qtbot.wait_until(lambda: desk.c.conversations.row_of(conv.id) >= 0, timeout=REPLY_MS)
        seen = []
        desk.c.rebuildProgress.connect(lambda title, done, total: seen.append(
            (title, done, total, desk.w.chat.notice.isVisible(), desk.w.status.state.text())))
        with qtbot.wait_signal(desk.c.currentChanged, timeout=REPLY_MS):
            desk.c.open_conversation(conv.id)
        qtbot.wait_until(lambda: bool(seen) and seen[-1][1] >= seen[-1][2], timeout=REPLY_MS)
        during = [s for s in seen if s[1] < s[2]]
        assert during, seen
        title, done, total, notice_shown, status = during[0]
        assert title == "Imported ports" and notice_shown and status.startswith("Rebuilding “Imported ports”")
        assert total > 400
        qtbot.wait_until(lambda: not desk.w.chat.notice.isVisible(), timeout=REPLY_MS)
        desk.w.chat.show_rebuild("Imported ports", 100, 900)                 # what the notice says
        assert "100 / 900 tokens" in desk.w.chat.notice.text()
        desk.w.chat.show_rebuild("Imported ports", 900, 900)
        assert not desk.w.chat.notice.isVisible()
    finally:
        close_desk(desk)
