"""Issue 41, items 1, 2 and 13 on the real window and the embedded model (offscreen): keystrokes typed as the
window appears land in the message box and create no empty conversation; a message goes to the highlighted
conversation even while it is rebuilt from history (shown at once, sent when the rebuild is done); a rebuild can
be cancelled; after New during a rebuild the message goes to the new conversation; the status bar says "Ready"
only once the conversation is open, and a waited message's first-token time counts from Enter."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.__main__ import build
from app.widgets.status_bar import StatusBar
from evoke_engine.conversations.exchange import FORMAT_NAME, FORMAT_VERSION
from integration.test_app_gui import REPLY_MS, close_desk, open_desk, test_settings

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]


def history_of(desk, conversation_id: str) -> list[tuple[str, str]]:
    rows = desk.bridge.call(desk.c.engine.messages, conversation_id).result(timeout=30)
    return [(r["role"], r["text"]) for r in rows]


def import_long(desk, qtbot, title: str, lines: int = 150) -> str:
    text = "\n".join(f"line {i}: the service on host {i} listens on port {4000 + i}." for i in range(lines))
    conv = desk.c.engine.import_conversation({
        "format": FORMAT_NAME, "version": FORMAT_VERSION, "title": title, "system_prompt": "", "tools": [],
        "messages": [{"role": "user", "text": "Here are the ports:\n" + text},
                     {"role": "assistant", "text": "Noted, all of them."}]})
    desk.c.refresh_conversations()
    qtbot.wait_until(lambda: desk.c.conversations.row_of(conv.id) >= 0, timeout=REPLY_MS)
    return conv.id


def click_row(desk, qtbot, conversation_id: str) -> None:
    row = desk.w.sidebar.visible_ids().index(conversation_id)
    rect = desk.w.sidebar.view.visualRect(desk.w.sidebar.proxy.index(row, 0))
    qtbot.mouseClick(desk.w.sidebar.view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())


def wait_rebuilding(desk, qtbot) -> None:
    qtbot.wait_until(lambda: desk.w.status.state.text().startswith("Rebuilding"), timeout=REPLY_MS)


def test_keys_typed_as_the_window_appears_land_in_the_message_box_and_wait_for_the_model(qapp, qtbot, tmp_path):
    bridge, controller, window = build(test_settings(tmp_path), (1200, 800))
    try:
        window.show()
        window.activateWindow()
        qtbot.waitActive(window)
        qtbot.wait_until(lambda: QApplication.activeWindow() is window)   # keys go to the active window
        model_may_load = threading.Event()       # the load waits behind this on the bridge's one call thread, so
        bridge.call(model_may_load.wait, 60)     # Enter is pressed while the model loads however fast it loads
        controller.start()
        qtbot.wait_until(lambda: QApplication.focusWidget() is not None)
        focused = QApplication.focusWidget()
        assert focused is window.input.prompt
        qtbot.keyClicks(focused, "hi there you")                    # spaces included: no button pressed
        assert window.input.prompt.toPlainText() == "hi there you"
        entered, entered_wall = time.perf_counter(), time.time()
        added = []
        controller.messageAdded.connect(lambda m: added.append((m.role, m.created_at)))
        with qtbot.wait_signal(controller.replyFinished, timeout=REPLY_MS) as finished:
            qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Return)
            after_enter = time.time()
            assert controller.model_state == "loading" and controller.queued    # shown, waiting for the model
            assert [m.text for m in controller.messages][:1] == ["hi there you"]
            time.sleep(0.2)                                              # a wait the footer must count
            model_may_load.set()
        waited_for = time.perf_counter() - entered
        reply = finished.args[0]
        assert "waited" in reply.meta                                  # the footer counts from Enter and says so
        first_token = float(reply.meta.split("first token ")[1].split(" s")[0])
        assert 0 < first_token <= waited_for + 0.05
        assert added[-1][0] == "assistant" and reply.created_at == added[-1][1]   # its own time: when it began
        assert entered_wall <= controller.messages[0].created_at <= after_enter      # the user's own: its Enter
        controller.refresh_conversations()
        qtbot.wait_until(lambda: not controller.generating and len(controller.conversations.rows) == 1)
        qtbot.wait_until(lambda: controller.conversations.rows[0].title != "New conversation", timeout=REPLY_MS)
        desk = SimpleNamespace(bridge=bridge, c=controller)
        assert history_of(desk, controller.current_id)[0] == ("user", "hi there you")
        assert window.focusWidget() is window.input.prompt             # where keys go while the window is active
        # New twice without writing: still one conversation kept beside the first, focus back in the box
        for _ in range(2):
            with qtbot.wait_signal(controller.currentChanged, timeout=REPLY_MS):
                qtbot.mouseClick(window.sidebar.new_button, Qt.MouseButton.LeftButton)
            assert window.focusWidget() is window.input.prompt
        assert window.sidebar.new_button.focusPolicy() == Qt.FocusPolicy.NoFocus
        controller.refresh_conversations()
        qtbot.wait_until(lambda: len(controller.conversations.rows) == 2, timeout=REPLY_MS)
    finally:
        window.close()
        bridge.close()


def test_a_message_goes_to_the_clicked_conversation_while_it_is_rebuilt_and_a_rebuild_can_be_cancelled(
        qapp, qtbot, tmp_path):
    desk = open_desk(tmp_path, settings=test_settings(tmp_path).replace(block_tokens=64))
    try:
        with qtbot.wait_signal(desk.c.replyFinished, timeout=REPLY_MS):
            assert desk.c.send("Say hello.")
        qtbot.wait_until(lambda: not desk.c.generating)
        first = desk.c.current_id
        imported = import_long(desk, qtbot, "Imported ports")
        # a click highlights the conversation and shows it at once; "Ready" waits until it is open
        click_row(desk, qtbot, imported)
        assert desk.c.current_id == imported and desk.w.title.text() == "Imported ports"
        assert desk.w.status.state.text() != "Ready"
        assert desk.w.focusWidget() is desk.w.input.prompt
        wait_rebuilding(desk, qtbot)
        assert desk.w.status.cancel.isVisible()
        # cancel it: the conversation stays shown from SQLite, nothing of it stays open
        with qtbot.wait_signal(desk.c.warningRaised, timeout=REPLY_MS) as warned:
            qtbot.mouseClick(desk.w.status.cancel, Qt.MouseButton.LeftButton)
        assert "cancelled" in warned.args[0]
        assert desk.c.current_id == imported and not desk.c.opening_ids
        engine = desk.c.engine
        assert engine.thread.call(lambda: engine.lifecycle.get(imported)) is None     # nothing of it stays open
        qtbot.wait_until(lambda: desk.w.status.state.text() == "Ready")
        assert [b.role for b in desk.w.chat.bubbles] == ["user", "assistant"]
        # a message written while another conversation opens goes there: shown at once, sent once it is rebuilt
        shorter = import_long(desk, qtbot, "Shorter ports", lines=40)
        click_row(desk, qtbot, shorter)
        qtbot.keyClicks(desk.w.focusWidget(), "Hi")
        with qtbot.wait_signal(desk.c.replyFinished, timeout=REPLY_MS):
            qtbot.keyClick(desk.w.focusWidget(), Qt.Key.Key_Return)
            assert desk.c.queued and desk.c.queued[0].conversation_id == shorter
            assert desk.w.chat.bubbles[-2].text().strip() == "Hi"
            assert shorter in desk.c.opening_ids
        qtbot.wait_until(lambda: not desk.c.generating)
        assert history_of(desk, shorter)[2] == ("user", "Hi")
        assert ("user", "Hi") not in history_of(desk, first) + history_of(desk, imported)
    finally:
        close_desk(desk)


def test_after_new_during_a_rebuild_the_message_goes_to_the_new_conversation(qapp, qtbot, tmp_path):
    desk = open_desk(tmp_path, settings=test_settings(tmp_path).replace(block_tokens=64))
    try:
        imported = import_long(desk, qtbot, "Imported ports")
        click_row(desk, qtbot, imported)
        wait_rebuilding(desk, qtbot)
        desk.w.new_action.trigger()                                      # Ctrl+N while it rebuilds
        assert desk.c.current_id != imported and desk.w.title.text() == "New conversation"
        qtbot.keyClicks(desk.w.focusWidget(), "Hello there")
        with qtbot.wait_signal(desk.c.replyFinished, timeout=REPLY_MS):
            qtbot.keyClick(desk.w.focusWidget(), Qt.Key.Key_Return)
            assert desk.w.input.prompt.toPlainText() == ""              # taken, not refused
            assert desk.w.chat.bubbles[-2].text().strip() == "Hello there"
        qtbot.wait_until(lambda: not desk.c.generating)
        new = desk.c.current_id
        assert new not in ("", imported)
        assert history_of(desk, new)[0] == ("user", "Hello there")
        assert len(history_of(desk, imported)) == 2                   # the left rebuild was cancelled, not written to
        desk.c.refresh_conversations()
        qtbot.wait_until(lambda: sorted(r.id for r in desk.c.conversations.rows) == sorted([new, imported]))
    finally:
        close_desk(desk)


def test_the_status_bar_names_a_read_only_window_and_the_size_of_a_conversation_not_loaded(qapp, qtbot):
    bar = StatusBar()
    qtbot.addWidget(bar)
    bar.set_model_state("read-only", "another Evoke Desk is using the data folder")
    assert bar.state.text() == "Read-only: another window owns this data folder"
    bar.set_stats({"active_tokens": 0, "budget_tokens": 0, "history_messages": 2, "history_chars": 2400})
    assert bar.gauge.text() == "Not loaded · 2 messages, 2,400 chars"
    bar.set_opening("Imported ports")
    bar.set_model_state("ready", "")
    assert bar.state.text() == "Opening “Imported ports”…"
    bar.set_opening("")
    assert bar.state.text() == "Ready"
