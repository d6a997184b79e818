"""Conversation editing from the window on the real engine (offscreen): the hover actions on a message
(copy, regenerate, edit, fork, delete), Ctrl+Shift+R, export and import (a bad file too), the fork
under its parent in the list and shared blocks marked in the memory panel."""

from __future__ import annotations

import json

import pytest
from helpers.ui_waits import UI_WAIT_MS
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtTest import QTest

from integration.test_app_gui import REPLY_MS, close_desk, fresh_conversation, open_desk, send_and_wait

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]


@pytest.fixture(scope="module")
def desk(qapp, tmp_path_factory):
    desk = open_desk(tmp_path_factory.mktemp("editing-home"))
    yield desk
    close_desk(desk)


def history(desk) -> list[dict]:
    return desk.bridge.call(desk.c.conv.messages).result(timeout=30)


def click_action(desk, qtbot, position: int, name: str) -> None:
    bubble = desk.w.chat.bubbles[position]
    desk.w.chat.ensureWidgetVisible(bubble)
    QTest.mouseMove(bubble, QPoint(bubble.width() // 2, 8))     # hovering shows the actions
    qtbot.wait_until(lambda: bubble.actions.isVisible(), timeout=UI_WAIT_MS)
    button = bubble.buttons[name]
    assert button.isVisible() and button.isEnabled(), name
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def two_turns(desk, qtbot) -> None:
    fresh_conversation(desk, qtbot)
    send_and_wait(desk, qtbot, "Say one word: apple.", max_tokens=6)
    send_and_wait(desk, qtbot, "Say one word: pear.", max_tokens=6)
    qtbot.wait_until(lambda: [m.index for m in desk.c.messages] == [0, 1, 2, 3])


def test_hover_shows_the_actions_that_apply_and_copy_takes_the_message(desk, qtbot):
    fresh_conversation(desk, qtbot)
    send_and_wait(desk, qtbot, "Say one word: hello.", max_tokens=6)
    user, reply = desk.w.chat.bubbles
    assert not reply.actions.isVisible()
    QTest.mouseMove(reply, QPoint(reply.width() // 2, 8))
    qtbot.wait_until(lambda: reply.actions.isVisible(), timeout=UI_WAIT_MS)
    assert reply.buttons["regenerate"].isVisible() and reply.buttons["edit"].isVisible()    # issue 41: replies too
    assert not user.buttons["edit"].isHidden() and user.buttons["regenerate"].isHidden()
    QTest.mouseMove(user, QPoint(user.width() // 2, 8))
    qtbot.wait_until(lambda: user.actions.isVisible() and not reply.actions.isVisible(), timeout=UI_WAIT_MS)
    with qtbot.wait_signal(desk.w.chat.messageCopied):
        click_action(desk, qtbot, 0, "copy")
    assert QGuiApplication.clipboard().text() == "Say one word: hello."
    click_action(desk, qtbot, 1, "copy")
    assert QGuiApplication.clipboard().text() == desk.c.messages[1].text


def test_regenerate_streams_a_new_reply_in_place_of_the_last(desk, qtbot):
    fresh_conversation(desk, qtbot)
    send_and_wait(desk, qtbot, "Name a color.", max_tokens=6)
    progress = []
    desk.c.replyProgress.connect(progress.append)
    with qtbot.wait_signal(desk.c.replyFinished, timeout=REPLY_MS) as done:
        click_action(desk, qtbot, 1, "regenerate")
        assert desk.c.generating and desk.w.chat.last_text().strip() in ("", "…", "▍")
    desk.c.replyProgress.disconnect(progress.append)
    qtbot.wait_until(lambda: not desk.c.generating and desk.c.messages[-1].index == 1)
    assert progress and done.args[0].text.strip()
    assert [r["role"] for r in history(desk)] == ["user", "assistant"]
    assert history(desk)[-1]["text"] == done.args[0].text == desk.c.messages[-1].text
    assert len(desk.w.chat.bubbles) == 2


def test_ctrl_shift_r_regenerates_the_last_reply(desk, qtbot):
    fresh_conversation(desk, qtbot)
    send_and_wait(desk, qtbot, "Name a fruit.", max_tokens=6)
    desk.w.activateWindow()
    with qtbot.wait_signal(desk.c.replyFinished, timeout=REPLY_MS):
        qtbot.keyClick(desk.w.input.prompt, Qt.Key.Key_R,
                       Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    qtbot.wait_until(lambda: not desk.c.generating)
    assert len(history(desk)) == 2 and len(desk.w.chat.bubbles) == 2


def test_edit_replaces_the_message_drops_later_ones_and_streams_the_reply(desk, qtbot):
    two_turns(desk, qtbot)
    asked = []
    desk.w.edit_text = lambda parent, title, label, text: asked.append(text) or "Say one word: plum."
    with qtbot.wait_signal(desk.c.replyFinished, timeout=REPLY_MS) as done:
        click_action(desk, qtbot, 0, "edit")
    qtbot.wait_until(lambda: not desk.c.generating and desk.c.messages[-1].index == 1)
    assert asked == ["Say one word: apple."]
    rows = history(desk)
    assert [(r["role"], r["text"]) for r in rows] == [("user", "Say one word: plum."), ("assistant", done.args[0].text)]
    assert [b.text().strip() for b in desk.w.chat.bubbles][0] == "Say one word: plum."
    assert len(desk.w.chat.bubbles) == 2


def test_fork_opens_a_new_conversation_under_its_parent(desk, qtbot):
    two_turns(desk, qtbot)
    parent = desk.c.current_id
    with qtbot.wait_signal(desk.c.messagesReset, timeout=REPLY_MS):
        click_action(desk, qtbot, 1, "fork")
    child = desk.c.current_id
    assert child != parent and desk.w.title.text().endswith("(fork)")
    assert [m.text for m in desk.c.messages] == [r["text"] for r in history(desk)] and len(desk.c.messages) == 2
    qtbot.wait_until(lambda: child in desk.w.sidebar.visible_ids())
    ids = desk.w.sidebar.visible_ids()
    assert ids.index(child) == ids.index(parent) + 1
    assert desk.w.sidebar.depth_of(child) == 1 and desk.w.sidebar.depth_of(parent) == 0
    qtbot.wait_until(lambda: any(r.sibling_shared for r in desk.c.blocks.rows), timeout=UI_WAIT_MS)
    marks = [desk.c.blocks.index(i, 3).data() for i in range(len(desk.c.blocks.rows))]
    assert "fork" in marks and "prefix" in marks


def test_delete_removes_one_message(desk, qtbot):
    two_turns(desk, qtbot)
    desk.w.confirm = lambda *args: True
    with qtbot.wait_signal(desk.c.messagesReset, timeout=REPLY_MS):
        click_action(desk, qtbot, 3, "delete")
    assert [r["text"] for r in history(desk)] == [m.text for m in desk.c.messages]
    assert len(desk.c.messages) == 3 and len(desk.w.chat.bubbles) == 3
    assert desk.c.messages[-1].text == "Say one word: pear."


def test_export_markdown_and_json_then_import_and_a_bad_file(desk, qtbot, tmp_path):
    fresh_conversation(desk, qtbot)
    send_and_wait(desk, qtbot, "Say one word: export.", max_tokens=6)
    original, texts = desk.c.current_id, [m.text for m in desk.c.messages]
    for name in ("chat.md", "chat.json"):
        desk.w.save_export = lambda parent, suggested, name=name: str(tmp_path / name)
        with qtbot.wait_signal(desk.c.exported, timeout=30_000):
            desk.w.export_action.trigger()
    assert "Say one word: export." in (tmp_path / "chat.md").read_text()
    json.loads((tmp_path / "chat.json").read_text())
    desk.w.pick_import = lambda parent: str(tmp_path / "chat.json")
    with qtbot.wait_signal(desk.c.messagesReset, timeout=30_000):
        desk.w.import_action.trigger()
    assert desk.c.current_id != original and [m.text for m in desk.c.messages] == texts
    imported = desk.c.current_id
    qtbot.wait_until(lambda: imported in desk.w.sidebar.visible_ids())
    count = len(desk.w.sidebar.visible_ids())
    (tmp_path / "bad.json").write_text("{not json")
    desk.w.pick_import = lambda parent: str(tmp_path / "bad.json")
    with qtbot.wait_signal(desk.c.errorRaised, timeout=30_000) as error:
        desk.w.import_action.trigger()
    assert "bad.json" in error.args[0] and "bad.json" in desk.w.banner.text()
    QTest.qWait(200)
    assert desk.c.current_id == imported and [m.text for m in desk.c.messages] == texts
    desk.c.refresh_conversations()
    QTest.qWait(300)
    assert len(desk.w.sidebar.visible_ids()) == count
