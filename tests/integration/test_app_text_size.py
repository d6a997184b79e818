"""Issue 58 item 17's text size on the real window (offscreen, the app's style sheet): Ctrl+Plus (and Ctrl+=),
Ctrl+Minus, Ctrl+0 and Ctrl+wheel change the chat's text (bubbles, code, the message box, the conversation list) in
steps within the setting's bounds, re-lay out what is shown in place (the same bubbles, the draft, the place in the
chat), save the setting, and a new window on the same home starts at the saved size; the Settings dialog changes it."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QFontInfo, QWheelEvent
from PySide6.QtWidgets import QApplication, QDialogButtonBox

from app.theme import apply_scheme, sheet_colours
from evoke_engine import Settings
from evoke_engine.store.history import HistoryDB
from integration.test_app_gui import REPLY_MS, close_desk, open_desk, test_settings

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]

CTRL = Qt.KeyboardModifier.ControlModifier
PARAGRAPH = "A paragraph long enough to wrap over a few lines of the chat, so that its height follows the text. " * 4
CODE = "```python\ndef add(a, b):\n    return a + b\n```"
PAIRS = 8                                   # messages enough for the chat to scroll


@pytest.fixture(scope="module")
def home(qapp, tmp_path_factory):
    home = tmp_path_factory.mktemp("text-size-home")
    with HistoryDB(test_settings(home).data_dir / "history.sqlite3") as history:
        history.create_conversation("c-long", "A long conversation", "", now=1000.0)
        for i in range(PAIRS):
            history.add_message("c-long", "user", f"Question {i}: {PARAGRAPH}", now=1001.0 + 2 * i)
            history.add_message("c-long", "assistant", f"Answer {i}: {PARAGRAPH}\n\n{CODE}", now=1002.0 + 2 * i)
    sheet, palette, theme = qapp.styleSheet(), qapp.palette(), qapp.property("evokeTheme")
    apply_scheme(qapp, "dark")                        # the app's own style sheet: its font sizes are the base
    yield home
    qapp.setStyleSheet(sheet)                         # the application is shared with later modules
    qapp.setPalette(palette)
    qapp.setProperty("evokeTheme", theme)


def open_long(desk, qtbot):
    if desk.c.current_id != "c-long":
        desk.c.open_conversation("c-long")
    qtbot.wait_until(lambda: desk.c.current_id == "c-long" and len(desk.w.chat.bubbles) == 2 * PAIRS
                     and desk.c.settled, timeout=REPLY_MS)


def shown(w) -> dict[str, float]:
    """The chat's text as rendered: the pixel sizes of the fonts matched for a message, its code, the box and the
    list, the height a message's text takes, the box's and a conversation row's heights."""
    reply = w.chat.bubbles[-1]
    return {"body": QFontInfo(reply.body.document().defaultFont()).pixelSize(),
            "body_height": reply.body.document().size().height(),
            "code": QFontInfo(reply.code_views()[0].text.document().defaultFont()).pixelSize(),
            "box": QFontInfo(w.input.prompt.font()).pixelSize(),
            "box_height": w.input.prompt.height(),
            "list": QFontInfo(w.sidebar.view.font()).pixelSize(),
            "row_height": w.sidebar.view.sizeHintForRow(0)}


def points(w) -> tuple[float, float]:
    """The point sizes asked for a message's text and the message box."""
    return w.chat.bubbles[-1].body.font().pointSizeF(), w.input.prompt.font().pointSizeF()


def press(desk, qtbot, key, percent: int) -> None:
    """Ctrl+`key` where the user types (the message box), then the chat laid out at `percent`."""
    qtbot.keyClick(desk.w.input.prompt, key, CTRL)
    assert desk.w.text_size.percent == percent
    qtbot.wait_until(lambda: desk.w.chat.bubbles[-1].body.height() >= desk.w.chat.bubbles[-1].body.document()
                     .size().height())


def ctrl_wheel(angle: int) -> QWheelEvent:
    return QWheelEvent(QPointF(10, 10), QPointF(10, 10), QPoint(0, 0), QPoint(0, angle), Qt.MouseButton.NoButton,
                       CTRL, Qt.ScrollPhase.NoScrollPhase, False)


def saved_text_size(home) -> int:
    return json.loads((home / "config" / "settings.json").read_text())["text_size"]


def top_bubble(chat):
    top = chat.verticalScrollBar().value()
    return next(b for b in chat.bubbles if b.geometry().bottom() >= top)


def test_the_keys_change_the_chat_text_in_steps_within_bounds_and_save_it(home, qtbot):
    desk = open_desk(home)
    try:
        w, c = desk.w, desk.c
        open_long(desk, qtbot)
        w.input.prompt.setPlainText("a draft that stays")
        bubbles = list(w.chat.bubbles)
        base = shown(w)
        assert points(w) == (10.5, 10.5)                                  # resources/style.qss's sizes
        assert not w.styleSheet() and c.settings.text_size == 100

        press(desk, qtbot, Qt.Key.Key_Plus, 110)
        press(desk, qtbot, Qt.Key.Key_Equal, 125)                         # Ctrl+= is Ctrl+Plus unshifted
        bigger = shown(w)
        for name, value in base.items():
            assert bigger[name] > value, name                             # every part of the chat's text grew
        assert points(w) == pytest.approx((10.5 * 1.25, 10.5 * 1.25), abs=0.01)
        assert c.settings.text_size == 125 and saved_text_size(home) == 125
        assert w.chat.bubbles == bubbles and w.input.prompt.toPlainText() == "a draft that stays"   # nothing rebuilt
        assert not sheet_colours(w.styleSheet())                          # sizes only: colours stay the theme's
        assert w.statusBar().currentMessage() == "Text size 125 %"

        press(desk, qtbot, Qt.Key.Key_Minus, 110)
        smaller = shown(w)
        for name, value in bigger.items():
            assert smaller[name] < value, name
        qtbot.keyClick(w.input.prompt, Qt.Key.Key_0, CTRL)                # back to the style sheet's sizes
        assert w.text_size.percent == 100 and not w.styleSheet()
        qtbot.wait_until(lambda: shown(w) == base)
        assert saved_text_size(home) == 100 and not w.text_size.reset_action.isEnabled()

        for _ in range(12):                                               # the steps stop at the lower bound
            qtbot.keyClick(w.input.prompt, Qt.Key.Key_Minus, CTRL)
        assert w.text_size.percent == 50 == c.settings.text_size and not w.text_size.smaller_action.isEnabled()
        assert points(w) == pytest.approx((5.25, 5.25), abs=0.01)
        for _ in range(20):                                               # and at the upper one
            w.text_size.bigger_action.trigger()
        assert w.text_size.percent == 300 and not w.text_size.bigger_action.isEnabled()
        assert saved_text_size(home) == 300
        w.text_size.reset_action.trigger()
        for part in (w.chat.bubbles[-1].body, w.chat.bubbles[-1].code_views()[0].text):
            wheel, size = ctrl_wheel(120), part.font().pointSizeF()   # Ctrl+wheel over a part of a message: passed
            QApplication.sendEvent(part.viewport(), wheel)                  # on to the chat, no zoom of its own
            assert not wheel.isAccepted() and part.font().pointSizeF() == size and w.text_size.percent == 100
        QApplication.sendEvent(w.chat.viewport(), ctrl_wheel(120))           # where the chat takes it: a step
        assert w.text_size.percent == 110
        for _ in range(3):                                                    # a touchpad's small deltas add up
            QApplication.sendEvent(w.chat.viewport(), ctrl_wheel(-40))
        assert w.text_size.percent == 100

        view = next(a.menu() for a in w.menuBar().actions() if a.text() == "&View")
        keys = {a.text(): a.shortcut().toString() for a in view.actions() if not a.isSeparator()}
        assert keys["Bigger text"] == "Ctrl++" and keys["Smaller text"] == "Ctrl+-"
        assert keys["Actual text size"] == "Ctrl+0"
        assert [k.toString() for k in w.text_size.bigger_action.shortcuts()] == ["Ctrl++", "Ctrl+="]
    finally:
        close_desk(desk)


def test_the_chat_keeps_its_place_when_the_text_changes_size(home, qtbot):
    desk = open_desk(home)
    try:
        w, chat = desk.w, desk.w.chat
        open_long(desk, qtbot)
        bar = chat.verticalScrollBar()
        qtbot.wait_until(lambda: bar.maximum() > 0)
        bar.setValue(bar.maximum())
        press(desk, qtbot, Qt.Key.Key_Plus, 110)                          # at the bottom: stays at the bottom
        qtbot.wait_until(lambda: bar.value() == bar.maximum())

        middle = chat.bubbles[PAIRS]                                       # scrolled up to a message in the middle
        bar.setValue(middle.y() + middle.height() // 2)
        assert top_bubble(chat) is middle
        for key, percent, moved in ((Qt.Key.Key_Plus, 125, int.__gt__), (Qt.Key.Key_Minus, 110, int.__lt__)):
            y, end = middle.y(), bar.maximum()
            press(desk, qtbot, key, percent)
            # once the messages above it moved (the column laid out at the new size), the same message is at the
            # top, as far into it as before: no jump to other messages
            qtbot.wait_until(lambda y=y, end=end, moved=moved: moved(middle.y(), y) and moved(bar.maximum(), end)
                             and top_bubble(chat) is middle
                             and abs(bar.value() - (middle.y() + middle.height() // 2)) <= 2)
        w.text_size.reset_action.trigger()
    finally:
        close_desk(desk)


def test_a_new_window_starts_at_the_saved_size_and_the_settings_dialog_changes_it(home, qapp, qtbot):
    desk = open_desk(home)
    try:
        press(desk, qtbot, Qt.Key.Key_Plus, 110)
        press(desk, qtbot, Qt.Key.Key_Plus, 125)
    finally:
        close_desk(desk)
    assert saved_text_size(home) == 125
    desk = open_desk(home, settings=Settings.load(home=str(home)))      # as the app starts: the saved settings
    try:
        w = desk.w
        open_long(desk, qtbot)
        assert w.text_size.percent == 125 and desk.c.settings.text_size == 125
        assert points(w) == pytest.approx((10.5 * 1.25, 10.5 * 1.25), abs=0.01)

        dialog = w.open_settings()
        editor = dialog.editors["text_size"]
        assert editor.value() == 125
        editor.setValue(150)
        with qtbot.wait_signal(desk.c.settingsApplied, timeout=REPLY_MS):
            qtbot.mouseClick(dialog.buttons.button(QDialogButtonBox.StandardButton.Ok), Qt.MouseButton.LeftButton)
        assert w.text_size.percent == 150 and saved_text_size(home) == 150
        assert points(w) == pytest.approx((10.5 * 1.5, 10.5 * 1.5), abs=0.01)

        apply_scheme(qapp, "light")                                       # the light theme keeps the size
        assert points(w) == pytest.approx((10.5 * 1.5, 10.5 * 1.5), abs=0.01)
        assert w.chat.grab().toImage().pixelColor(5, 5).lightness() > 200
        w.text_size.reset_action.trigger()
    finally:
        close_desk(desk)
