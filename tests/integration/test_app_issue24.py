"""Issue 24, the window's defects, on the real window and the embedded model (offscreen): history without a
model, the first message before the model is ready, settings errors in the dialog, banners that clear."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox

from app.__main__ import build
from evoke_engine.store.history import HistoryDB
from integration.test_app_gui import REPLY_MS, close_desk, fresh_conversation, open_desk, send_and_wait, test_settings

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]


def seed_history(settings) -> list[str]:
    """Two conversations written straight to SQLite (what earlier sessions left), newest last."""
    history = HistoryDB(settings.data_dir / "history.sqlite3")
    try:
        history.create_conversation("c-old", "Ports of the service", "", now=1000.0)
        history.add_message("c-old", "user", "Which port does the service use?", now=1001.0)
        history.add_message("c-old", "assistant", "It listens on port 4003.", now=1002.0)
        history.create_conversation("c-new", "Rust lifetimes", "", now=2000.0)
        history.add_message("c-new", "user", "Explain lifetimes briefly.", now=2001.0)
        history.add_message("c-new", "assistant", "They say how long a reference is valid.", now=2002.0)
    finally:
        history.close()
    return ["c-new", "c-old"]


@pytest.fixture(scope="module")
def desk(qapp, tmp_path_factory):
    home = tmp_path_factory.mktemp("issue24-home")
    desk = open_desk(home, settings=test_settings(home).replace(tools_enabled=True))   # a prefix past 64 tokens
    yield desk
    close_desk(desk)


def press_ok(qtbot, dialog) -> None:
    qtbot.mouseClick(dialog.buttons.button(QDialogButtonBox.StandardButton.Ok), Qt.MouseButton.LeftButton)


# -- 3: a bad model at start-up ----------------------------------------------------------------
@pytest.mark.parametrize("bad", ["missing", "garbage"])
def test_a_bad_model_at_start_keeps_the_history_readable_and_a_working_model_clears_the_error(
        qapp, qtbot, tmp_path, bad):
    path = tmp_path / f"{bad}.gguf"
    if bad == "garbage":
        path.write_bytes(b"this is not a GGUF file\n" * 64)
    settings = test_settings(tmp_path).replace(model_path=str(path))
    seed_history(settings)
    bridge, controller, window = build(settings, (1100, 700))
    window.show()
    try:
        with qtbot.wait_signal(controller.modelStateChanged, timeout=REPLY_MS,
                               check_params_cb=lambda state, _detail: state == "failed"):
            controller.start()
        assert f"{bad}.gguf" in window.banner.text()
        qtbot.wait_until(lambda: window.sidebar.visible_titles() == ["Rust lifetimes", "Ports of the service"])
        qtbot.wait_until(lambda: [b.text().strip() for b in window.chat.bubbles]
                         == ["Explain lifetimes briefly.", "They say how long a reference is valid."])
        assert window.title.text() == "Rust lifetimes"
        # another conversation opens from the list, read from SQLite
        with qtbot.wait_signal(controller.messagesReset, timeout=30_000):
            rect = window.sidebar.view.visualRect(window.sidebar.proxy.index(1, 0))
            qtbot.mouseClick(window.sidebar.view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
        assert window.chat.bubbles[-1].text().strip() == "It listens on port 4003."
        assert window.title.text() == "Ports of the service"
        # sending says why nothing can answer, and keeps the text
        window.input.prompt.setPlainText("Which port again?")
        qtbot.keyClick(window.input.prompt, Qt.Key.Key_Return)
        assert window.input.prompt.toPlainText() == "Which port again?"
        assert "No model is loaded" in window.banner.text() and "Settings" in window.banner.text()
        # a working model: the error goes, the conversation on screen opens for real and answers
        dialog = window.open_settings()
        dialog.editors["model_path"].set_path(None)
        press_ok(qtbot, dialog)
        qtbot.wait_until(lambda: controller.model_state == "ready" and controller.settled,
                         timeout=REPLY_MS)
        assert window.banner.text() == ""
        assert controller.current_id == "c-old" and len(window.chat.bubbles) == 2
        reply = send_and_wait(SimpleNamespace(c=controller), qtbot, window.input.prompt.toPlainText())
        assert reply.text.strip() and len(window.chat.bubbles) == 4
    finally:
        window.close()
        bridge.close()


# -- 4: the first message before the model is ready --------------------------------------------
def test_a_message_sent_while_the_model_loads_waits_in_the_chat_and_is_sent_when_ready(qapp, qtbot, tmp_path):
    bridge, controller, window = build(test_settings(tmp_path), (1100, 700))
    window.show()
    try:
        controller.start()
        assert controller.model_state == "loading" and controller.conv is None
        assert window.input.send_button.isEnabled()
        window.input.prompt.setPlainText("Name a primary color.")
        with qtbot.wait_signal(controller.replyFinished, timeout=REPLY_MS) as done:
            qtbot.keyClick(window.input.prompt, Qt.Key.Key_Return)
            assert window.input.prompt.toPlainText() == ""               # taken, not dropped
            assert [b.role for b in window.chat.bubbles] == ["user", "assistant"]
            assert "Waiting for the model" in window.chat.bubbles[-1].footer.text()
        assert done.args[0].text.strip() and done.args[0].stopped != "error"
        qtbot.wait_until(lambda: not controller.generating)
        history = bridge.call(controller.conv.messages).result(timeout=30)
        assert [r["role"] for r in history] == ["user", "assistant"]
        assert history[0]["text"] == "Name a primary color."
        assert [b.role for b in window.chat.bubbles] == ["user", "assistant"]
        assert "Waiting" not in window.chat.bubbles[-1].footer.text()
    finally:
        window.close()
        bridge.close()


# -- 6: errors show where the user looks, and clear when their cause is gone ---------------------
def test_a_budget_too_small_for_the_prefix_is_refused_in_the_dialog_naming_the_smallest(desk, qtbot):
    fresh_conversation(desk, qtbot)
    prefix = int(desk.c.stats.prefix_tokens)
    dialog = desk.w.open_settings()
    dialog.set_value("budget_tokens", prefix)
    with qtbot.assert_not_emitted(dialog.applied):
        press_ok(qtbot, dialog)
    smallest = desk.bridge.call(desk.c.engine.min_budget_tokens).result(timeout=30)     # the engine's rule
    assert smallest > 64
    assert dialog.isVisible() and f"smallest budget that works is {smallest} tokens" in dialog.error.text()
    assert desk.w.banner.text() == ""
    dialog.set_value("budget_tokens", smallest)
    with qtbot.wait_signal(desk.c.settingsApplied, timeout=REPLY_MS):
        press_ok(qtbot, dialog)
    qtbot.wait_until(lambda: not dialog.isVisible())
    dialog = desk.w.open_settings()
    dialog.set_value("budget_tokens", 1024)
    with qtbot.wait_signal(desk.c.settingsApplied, timeout=REPLY_MS):
        press_ok(qtbot, dialog)
    qtbot.wait_until(lambda: not dialog.isVisible())


def test_an_engine_refusal_shows_in_the_open_dialog_and_a_bad_model_keeps_it_open(desk, qtbot, tmp_path):
    fresh_conversation(desk, qtbot)
    dialog = desk.w.open_settings()
    dialog.editors["model_path"].set_path(str(tmp_path / "nowhere.gguf"))
    with qtbot.wait_signal(desk.c.settingsFailed, timeout=REPLY_MS):
        press_ok(qtbot, dialog)
    assert dialog.isVisible() and "nowhere.gguf" in dialog.error.text()
    assert desk.w.banner.text() == ""                                 # not behind the dialog
    assert dialog.buttons.isEnabled()
    dialog.reject()
    qtbot.wait_until(lambda: desk.c.model_state == "ready")


def test_a_budget_error_clears_once_a_good_budget_applies(desk, qtbot):
    fresh_conversation(desk, qtbot)
    prefix = int(desk.c.stats.prefix_tokens)
    with qtbot.wait_signal(desk.c.settingsFailed, timeout=REPLY_MS):
        desk.c.apply_settings(desk.c.settings.replace(budget_tokens=prefix))   # no dialog open: the banner
    assert "budget" in desk.w.banner.text()
    with qtbot.wait_signal(desk.c.settingsApplied, timeout=REPLY_MS):
        desk.c.apply_settings(desk.c.settings.replace(budget_tokens=1024))
    assert desk.w.banner.text() == ""


def test_an_import_error_clears_when_another_conversation_opens(desk, qtbot, tmp_path):
    first = fresh_conversation(desk, qtbot)
    bad = tmp_path / "not-a-conversation.json"
    bad.write_text("{ nope", encoding="utf-8")
    with qtbot.wait_signal(desk.c.errorRaised, timeout=30_000):
        desk.w.pick_import = lambda parent: str(bad)
        desk.w.import_conversation()
    assert "not-a-conversation.json" in desk.w.banner.text()
    fresh_conversation(desk, qtbot)
    assert desk.w.banner.text() == ""
    assert desk.c.current_id != first


# -- 5: long code lines ------------------------------------------------------------------------
def test_a_long_code_line_scrolls_inside_its_block_and_copy_stays_in_view(desk, qtbot):
    from PySide6.QtGui import QGuiApplication

    from app.messages import ChatMessage

    fresh_conversation(desk, qtbot)
    long_line = "result = compute(" + ", ".join(f"argument_{i}" for i in range(60)) + ")"
    text = f"Here:\n```python\n{long_line}\nprint(result)\n```\nDone."
    chat = desk.w.chat
    bubble = chat.add(ChatMessage("assistant", text, meta="12 tokens · 40.0 tok/s"))
    qtbot.wait_until(lambda: bubble.isVisible() and bubble.code_views()[0].text.horizontalScrollBar().maximum() > 0)
    view = bubble.code_views()[0]
    viewport = chat.viewport()
    bubble_right = bubble.mapTo(viewport, bubble.rect().topRight()).x()
    assert bubble_right <= viewport.width()                                  # the message is not widened
    copy_right = view.copy_button.mapTo(viewport, view.copy_button.rect().topRight()).x()
    assert view.copy_button.isVisible() and copy_right <= viewport.width()   # Copy stays on screen
    bar = view.text.horizontalScrollBar()
    bar.setValue(bar.maximum())                                              # the end of the line is reachable
    assert bar.value() == bar.maximum() > 0
    assert view.text.height() >= view.text.document().size().height()      # no line is cut off below
    qtbot.mouseClick(view.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == f"{long_line}\nprint(result)"
    assert bubble.footer.text() == "12 tokens · 40.0 tok/s"
    assert "Done." in bubble.text()


# -- 9: smaller ones ---------------------------------------------------------------------------
def test_a_long_event_line_wraps_in_the_memory_panel(desk, qtbot):
    events = desk.w.memory.events
    long_text = "recovered file:service_notes.txt#12 into the context at position 1840 " * 4
    desk.c.events.append("recovered", long_text.strip())
    index = desk.c.events.index(len(desk.c.events.rows) - 1, 0)
    qtbot.wait_until(lambda: events.visualRect(index).height() > 0)
    line = events.fontMetrics().height()
    assert events.visualRect(index).height() >= 2 * line                   # wrapped onto more lines, not cut
    assert events.visualRect(index).right() <= events.viewport().width()


def test_the_rename_dialog_shows_its_whole_title_and_the_edit_dialog_is_roomy_and_wraps(desk, qtbot):
    from PySide6.QtWidgets import QPlainTextEdit

    from app import dialogs

    rename = dialogs.TextDialog(desk.w, "Rename conversation", "Title:", "Fruit talk")
    qtbot.addWidget(rename)
    rename.show()
    assert rename.width() >= rename.fontMetrics().horizontalAdvance("Rename conversation") + 150
    rename.reject()
    edit = dialogs.EditDialog(desk.w, "Edit message", "The message (later messages are replaced):", "word " * 400)
    qtbot.addWidget(edit)
    edit.show()
    assert edit.width() >= 520 and edit.height() >= 320
    assert edit.editor.lineWrapMode() == QPlainTextEdit.LineWrapMode.WidgetWidth
    assert edit.editor.horizontalScrollBar().maximum() == 0                  # long text wraps
    assert edit.text() == "word " * 400
    edit.reject()


def test_the_model_has_one_name_its_gguf_file_name(desk):
    from pathlib import Path

    name = Path(desk.c.model_info.path).name
    assert name.endswith(".gguf") and desk.w.status.model.text() == name
    dialog = desk.w.open_settings()
    combo = dialog.editors["model_path"].combo
    assert combo.currentText().startswith(name)                       # the embedded model, by the same name
    dialog.reject()
