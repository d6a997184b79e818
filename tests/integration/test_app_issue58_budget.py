"""Issue 58 item 13 on the real window (offscreen): one rule for the budget, the smallest that holds the shared
prefix and a reply (`min_budget_tokens`), whether it comes from the settings file or the dialog. A saved 100 is named
in the banner and New says why it cannot create (before: New and Ctrl+N did nothing, silently); in the dialog a typed
10 stays and says why instead of silently reverting."""

from __future__ import annotations

import dataclasses

import pytest
from helpers.ui_waits import UI_WAIT_MS
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox

from evoke_engine.store.history import HistoryDB
from integration.test_app_gui import close_desk, open_desk, test_settings

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]


@pytest.fixture(scope="module")
def desk(qapp, tmp_path_factory):
    home = tmp_path_factory.mktemp("budget-home")
    settings = dataclasses.replace(test_settings(home), budget_tokens=100)     # in range for the file, too small
    with HistoryDB(settings.data_dir / "history.sqlite3") as history:
        history.create_conversation("c-old", "Earlier chat", "", now=1000.0)
        history.add_message("c-old", "user", "Hello there.", now=1001.0)
    desk = open_desk(home, settings=settings)
    yield desk
    close_desk(desk)


def test_a_saved_budget_too_small_is_named_and_new_says_why_it_cannot_create(desk, qtbot):
    w, c = desk.w, desk.c
    qtbot.wait_until(lambda: c.budget_below_floor, timeout=30_000)      # the engine measured the smallest budget
    assert w.banner.isVisible() and "100 tokens" in w.banner.label.text()
    before = c.current_id
    w.activateWindow()
    with qtbot.wait_signal(c.errorRaised, timeout=UI_WAIT_MS) as said:
        qtbot.keyClick(w.input.prompt, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert "cannot start" in said.args[0] and "100 tokens" in said.args[0]
    assert c.current_id == before and not c.creating                    # the open conversation stays


def test_a_budget_typed_below_the_smallest_says_why_in_the_dialog(desk, qtbot):
    dialog = desk.w.open_settings()
    try:
        box = dialog.editors["budget_tokens"]
        dialog.tabs.setCurrentIndex(dialog._tab_of("budget_tokens"))
        box.setFocus()
        box.lineEdit().selectAll()
        qtbot.keyClicks(box.lineEdit(), "10")
        assert box.value() == 10                                         # kept as typed, not reverted
        assert dialog.error.isVisible() and "10 tokens is too small" in dialog.error.text()
        assert "smallest budget that works" in dialog.error.text()
        with qtbot.assert_not_emitted(dialog.applied):
            qtbot.mouseClick(dialog.buttons.button(QDialogButtonBox.StandardButton.Apply), Qt.MouseButton.LeftButton)
        assert dialog.isVisible() and "10 tokens" in dialog.error.text()
        box.lineEdit().selectAll()
        qtbot.keyClicks(box.lineEdit(), "4096")
        assert not dialog.error.isVisible()                              # a budget that works: the reason goes
    finally:
        dialog.reject()
