"""Issue 59 on the real window and the embedded model (offscreen): each conversation owns its draft, its streaming
reply and its Stop. Enter in B while A generates sends B's message, decoded beside A's reply; Stop in B stops only
B's reply; switching between two generating conversations 20 times never duplicates, moves or mislabels a bubble,
and each keeps its own draft."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from integration.test_app_gui import REPLY_MS, close_desk, open_desk, test_settings

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]

COUNTING = "Count from 1 to 300, one number per line."


@pytest.fixture(scope="module")
def desk(qapp, tmp_path_factory):
    home = tmp_path_factory.mktemp("issue59-home")
    desk = open_desk(home, settings=test_settings(home).replace(slots=4, parallel_replies=3,
                                                                       max_tokens=400))   # replies outlast the test
    yield desk
    close_desk(desk)


def new_conversation(desk, qtbot) -> str:
    with qtbot.wait_signal(desk.c.conversationSettled, timeout=REPLY_MS):
        desk.c.new_conversation()
    return desk.c.current_id


def show(desk, qtbot, conversation_id: str) -> None:
    with qtbot.wait_signal(desk.c.currentChanged, timeout=REPLY_MS):
        desk.c.open_conversation(conversation_id)
    qtbot.wait_until(lambda: desk.c.history_loaded, timeout=REPLY_MS)


def press_enter(desk, qtbot, text: str) -> None:
    desk.w.input.prompt.setPlainText(text)
    qtbot.keyClick(desk.w.input.prompt, Qt.Key.Key_Return)
    assert desk.w.input.prompt.toPlainText() == ""                       # sent, not kept waiting in the box


def bubbles(desk) -> list[tuple[str, str]]:
    return [(b.role, b.source) for b in desk.w.chat.bubbles]


def test_enter_in_b_while_a_generates_sends_b_and_stop_in_b_stops_only_b(desk, qtbot):
    a = new_conversation(desk, qtbot)
    press_enter(desk, qtbot, COUNTING)
    qtbot.wait_until(lambda: len(desk.c.streams.get(a, None).text if a in desk.c.streams else "") > 10,
                     timeout=REPLY_MS)
    b = new_conversation(desk, qtbot)
    assert not desk.c.generating and desk.w.input.send_button.isVisible()     # B's box sends, A's Stop is not here
    press_enter(desk, qtbot, "Count from 1 to 200, one number per line.")
    assert set(desk.c.streams) == {a, b}                                       # both replies are being written
    # and the sidebar says so, once it lists B (its row comes with the list's refresh, after the model's reply)
    qtbot.wait_until(lambda: marked_writing(desk) >= {a, b}, timeout=REPLY_MS)
    qtbot.wait_until(lambda: len(desk.c.streams[b].text) > 5 if b in desk.c.streams else True, timeout=REPLY_MS)
    assert a in desk.c.streams and desk.w.input.stop_button.isVisible()
    with qtbot.wait_signal(desk.c.replyFinished, timeout=REPLY_MS) as finished:
        qtbot.mouseClick(desk.w.input.stop_button, Qt.MouseButton.LeftButton)
    assert finished.args[0].stopped == "cancelled" and b not in desk.c.streams
    assert a in desk.c.streams                                                 # A writes on
    qtbot.wait_until(lambda: b not in marked_writing(desk), timeout=REPLY_MS)  # by the engine's word too
    desk.bridge.call(desk.c.engine.cancel, a).result(30)
    qtbot.wait_until(lambda: not desk.c.streams, timeout=REPLY_MS)
    qtbot.wait_until(lambda: not marked_writing(desk), timeout=REPLY_MS)


def test_a_reply_the_endpoint_writes_is_marked_in_the_sidebar(desk, qtbot):
    """A conversation the window did not send to (an endpoint client's, here a turn submitted to the engine as the
    endpoint's service does) is marked while its reply is written, within the sidebar's poll."""
    engine = desk.c.engine
    conversation = desk.bridge.call(engine.new_conversation).result(30)      # made as the endpoint makes its own
    other = str(conversation.id)
    desk.c.refresh_conversations()
    qtbot.wait_until(lambda: desk.c.conversations.row_of(other) >= 0, timeout=REPLY_MS)
    future = conversation.submit(COUNTING, max_tokens=300)
    qtbot.wait_until(lambda: other in marked_writing(desk), timeout=REPLY_MS)
    assert other not in desk.c.streams                                        # not the window's own reply
    title = desk.c.conversations.rows[desk.c.conversations.row_of(other)].title
    qtbot.wait_until(lambda: f"“{title}”" in desk.w.memory.writing.text(), timeout=REPLY_MS)
    assert desk.w.memory.writing.isVisible()                                  # the memory panel names it too
    engine.cancel(other)
    future.result(REPLY_MS / 1000)
    qtbot.wait_until(lambda: other not in marked_writing(desk), timeout=REPLY_MS)
    qtbot.wait_until(lambda: not desk.w.memory.writing.isVisible(), timeout=REPLY_MS)


def marked_writing(desk) -> set[str]:
    """The conversations the sidebar marks as writing a reply (GeneratingRole)."""
    from app.item_models import GeneratingRole, IdRole

    model = desk.c.conversations
    return {model.data(model.index(row), IdRole) for row in range(model.rowCount())
            if model.data(model.index(row), GeneratingRole)}


def test_switching_between_two_generating_conversations_keeps_bubbles_and_drafts(desk, qtbot):
    a = new_conversation(desk, qtbot)
    press_enter(desk, qtbot, COUNTING)
    b = new_conversation(desk, qtbot)
    press_enter(desk, qtbot, "Count from 1 to 250, one number per line.")
    drafts = {a: "a draft for A, not sent", b: "B's own draft"}
    desk.w.input.prompt.setPlainText(drafts[b])
    both_writing = 0
    for switch in range(20):
        both_writing += set(desk.c.streams) == {a, b}
        target = a if switch % 2 == 0 else b
        show(desk, qtbot, target)
        assert desk.c.current_id == target
        assert desk.w.input.prompt.toPlainText() == (drafts[b] if target == b else
                                                     (drafts[a] if switch > 0 else ""))
        if switch == 0:
            desk.w.input.prompt.setPlainText(drafts[a])                        # A's draft, typed on A's page
        shown = bubbles(desk)
        assert [role for role, _ in shown] == ["user", "assistant"]           # one question, one reply: no copy
        assert shown[0][1].startswith("Count from 1 to " + ("300" if target == a else "250"))
        stream = desk.c.streams.get(target)
        assert desk.w.input.stop_button.isVisible() == (stream is not None)   # its own Stop, only while it writes
        qtbot.wait(60)
        if stream is not None and target in desk.c.streams:                    # the bubble follows its own stream
            assert stream.text.startswith(desk.w.chat.bubbles[-1].source)
    assert both_writing >= 15                                                  # switched while both wrote
    for conversation_id in (a, b):
        desk.bridge.call(desk.c.engine.cancel, conversation_id).result(30)
    qtbot.wait_until(lambda: not desk.c.streams, timeout=REPLY_MS)
    for conversation_id in (a, b):
        show(desk, qtbot, conversation_id)
        rows = desk.c.engine.messages(conversation_id)
        assert [r["role"] for r in rows] == ["user", "assistant"]             # stored once each, in its own place
        assert [(m.role, m.text) for m in desk.c.messages] == [(r["role"], r["text"]) for r in rows]
