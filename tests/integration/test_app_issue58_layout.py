"""Issue 58 item 14 on the real window (offscreen, the app's style sheet): with the sidebar and the memory panel open,
1024×700 and 800×600 windows fit, the panels give way and come back, and every bubble wraps to the chat's width."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QWidget

from app.theme import apply_scheme
from app.widgets.code_block import CodeBlockView
from evoke_engine.store.history import HistoryDB
from integration.test_app_gui import REPLY_MS, close_desk, open_desk, test_settings

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]

PARAGRAPH = ("Small windows must still show the whole reply: every line of this paragraph wraps to the width "
             "the chat has, whatever the panels beside it take. ") * 6
UNBROKEN = "https://example.org/" + "a-very-long-path-segment-" * 8
WIDE_CODE = "```python\nresult = compute(" + ", ".join(f"argument_{i}" for i in range(30)) + ")\n```"
REPLY = f"{PARAGRAPH}\n\n{UNBROKEN}\n\n{WIDE_CODE}\n\nAnd a last paragraph after the code: {PARAGRAPH}"
TITLE = "A conversation whose title is much longer than the header of a small window can show in one line"
CUT_REPLY = {"metrics": {"tokens": 400, "tokens_per_s": 12.5, "ttft_s": 0.31, "stopped": "max_tokens"}}
WAIT_MS = 5_000
SIZES = [(1024, 700), (800, 600)]


@pytest.fixture(scope="module")
def desk(qapp, tmp_path_factory):
    home = tmp_path_factory.mktemp("issue58-layout-home")
    settings = test_settings(home)
    with HistoryDB(settings.data_dir / "history.sqlite3") as history:
        history.create_conversation("c-wide", TITLE, "", now=1000.0)
        history.add_message("c-wide", "user", PARAGRAPH + UNBROKEN, now=1001.0)
        history.add_message("c-wide", "assistant", REPLY, now=1002.0, extra=CUT_REPLY)
    sheet, palette, theme = qapp.styleSheet(), qapp.palette(), qapp.property("evokeTheme")
    apply_scheme(qapp, "dark")                        # the app's own style sheet: its margins and fonts count
    desk = open_desk(home, settings=settings)
    yield desk
    close_desk(desk)
    qapp.setStyleSheet(sheet)                         # the application is shared with later modules
    qapp.setPalette(palette)
    qapp.setProperty("evokeTheme", theme)


def right_of(widget: QWidget, within: QWidget) -> int:
    """The x just past `widget`'s right edge, in `within`'s coordinates."""
    return widget.mapTo(within, QPoint(widget.width(), 0)).x()


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_a_small_window_wraps_the_chat_beside_open_panels(desk, qtbot, size):
    w, chat = desk.w, desk.w.chat
    if desk.c.current_id != "c-wide":
        desk.c.open_conversation("c-wide")
    qtbot.wait_until(lambda: desk.c.current_id == "c-wide" and len(chat.bubbles) == 2, timeout=REPLY_MS)
    w.memory_dock.show()
    w.sidebar.show()
    w.resize(*size)
    qtbot.wait(300)                                                       # layouts and documents settle

    minimum = w.minimumSizeHint().width()
    assert minimum <= 800, f"the open panels force a window {minimum} px wide"
    assert w.size().toTuple() == size, f"the window stays {w.size().toTuple()}"
    assert w.memory_dock.isVisible() and w.sidebar.isVisible()           # they gave way, still open
    assert chat.width() >= 300                                            # and the chat keeps a readable width
    assert w.memory_dock.width() < 400 and right_of(w.memory_dock, w) <= w.width()
    assert not chat.horizontalScrollBar().isVisible(), "the chat scrolls sideways"
    viewport = chat.viewport()
    assert chat.widget().width() <= viewport.width()
    reply = chat.bubbles[1]
    assert reply.reply_end.isVisible() and reply.reply_end.button.isVisible()   # "Continue generating" fits too
    assert reply.code_views(), "the reply shows its code block"
    for bubble in chat.bubbles:
        assert right_of(bubble, viewport) <= viewport.width(), f"the {bubble.role} bubble is cut"
        for part in [*bubble.parts, bubble.footer, bubble.reply_end, bubble.actions]:
            if part.isVisibleTo(bubble):
                assert right_of(part, bubble) <= bubble.width(), f"{part.objectName()} overflows its bubble"
        for body in (p for p in bubble.parts if not isinstance(p, CodeBlockView) and p.isVisible()):
            assert body.document().size().width() <= body.viewport().width() + 1   # the text wraps, nothing hidden
    for block in reply.code_views():                                     # a long code line scrolls in its block
        assert block.text.horizontalScrollBar().maximum() > 0 and block.copy_button.isVisible()
        assert right_of(block.copy_button, reply) <= reply.width()
    assert right_of(w.title, w) <= right_of(chat, w)                     # the long title does not widen the window


def test_a_narrow_bubble_offers_its_actions_in_one_menu_and_the_panels_come_back(desk, qtbot):
    w, chat = desk.w, desk.w.chat
    w.resize(800, 600)
    qtbot.wait_until(lambda: w.memory_dock.width() < 300, timeout=WAIT_MS)
    reply = chat.bubbles[-1]
    reply.show_actions(True)
    qtbot.wait_until(lambda: reply.actions.more.isVisible(), timeout=WAIT_MS)      # the row does not fit: "⋯"
    assert not any(button.isVisible() for button in reply.buttons.values())
    reply.actions.menu.aboutToShow.emit()
    entries = {action.text(): action for action in reply.actions.menu.actions()}
    assert list(entries) == ["Copy", "Regenerate", "Edit", "Fork", "Delete"]       # the buttons that apply, in order
    with qtbot.wait_signal(chat.messageCopied, timeout=WAIT_MS):
        entries["Copy"].trigger()
    assert QGuiApplication.clipboard().text() == reply.source
    w.resize(1440, 900)                                                   # room again: the panels get theirs back
    qtbot.wait_until(lambda: w.memory_dock.width() >= 380 and w.sidebar.width() >= 250, timeout=WAIT_MS)
    qtbot.wait_until(lambda: not reply.actions.compact, timeout=WAIT_MS)
    assert reply.buttons["regenerate"].isVisible() and not reply.actions.more.isVisible()
    reply.show_actions(False)
