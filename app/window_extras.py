"""The window's later parts, installed on a built MainWindow: the undo bar and Ctrl+Z, message versions,
the Help menu (keyboard shortcuts, About), the theme that follows the setting and the desktop, and the text size.

Invariant: like the window, this only wires controller signals to widgets and user actions to controller
methods; dialogs open through `window.show_dialog` (replaced in tests) and are kept as `window.help_dialog`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDialog

from .help_dialogs import AboutDialog, ShortcutsDialog, about_facts, shortcut_rows
from .model_download_flow import install_models
from .theme import ThemeFollower
from .widgets.undo_bar import UndoBar
from .window_exchange import install_exchange
from .window_text_size import install_text_size

if TYPE_CHECKING:
    from .window import MainWindow


def install_extras(window: MainWindow) -> None:
    c = window.controller
    window.undo_bar = UndoBar()
    column = window.banner.parentWidget().layout()
    column.insertWidget(column.indexOf(window.banner) + 1, window.undo_bar)
    c.undoChanged.connect(window.undo_bar.offer)
    window.undo_bar.undoClicked.connect(c.undo_delete)
    window.undo_action = QAction("Undo delete", window, shortcut=QKeySequence.StandardKey.Undo,
                                 triggered=c.undo_delete)
    window.addAction(window.undo_action)
    c.versionsChanged.connect(window.chat.set_versions)
    window.chat.versionRequested.connect(c.switch_version)          # ‹ › makes that version (and its branch) current
    window.chat.continueRequested.connect(lambda: c.continue_reply())
    window.continue_action = QAction("Continue generating", window, triggered=lambda: c.continue_reply())
    conversation_menu = next((a.menu() for a in window.menuBar().actions() if a.text() == "&Conversation"), None)
    if conversation_menu is not None:
        conversation_menu.addAction(window.undo_action)
        conversation_menu.addAction(window.continue_action)

    install_exchange(window)             # Export all, Export in the list's menu (app/window_exchange.py)

    window.help_dialog = None
    window.show_dialog = lambda dialog: dialog.open()
    help_menu = window.menuBar().addMenu("&Help")
    window.shortcuts_action = help_menu.addAction("Keyboard shortcuts", lambda: open_shortcuts(window))
    window.shortcuts_action.setShortcut(QKeySequence("Ctrl+/"))
    window.addAction(window.shortcuts_action)
    window.about_action = help_menu.addAction("About Evoke Desk", lambda: open_about(window))
    install_models(window)               # the Model menu's "Get a model…" (app/model_download_flow.py)

    window.theme = ThemeFollower(getattr(c.settings, "theme", "auto"), window)
    c.settingsApplied.connect(lambda s: window.theme.set_mode(getattr(s, "theme", "auto")))
    install_text_size(window)            # View's Bigger text, Smaller text, Actual text size (app/window_text_size.py)


def all_actions(window: MainWindow) -> list[QAction]:
    """The window's actions: those on the window and those in its menus, in menu order, each once."""
    seen: list[QAction] = []
    for top in window.menuBar().actions():
        menu = top.menu()
        for action in menu.actions() if menu is not None else []:
            if action not in seen and not action.isSeparator():
                seen.append(action)
    return seen + [a for a in window.actions() if a not in seen]


def open_shortcuts(window: MainWindow) -> QDialog:
    dialog = ShortcutsDialog(shortcut_rows(all_actions(window)), window)
    window.help_dialog = dialog
    window.show_dialog(dialog)
    return dialog


def open_about(window: MainWindow) -> QDialog:
    dialog = AboutDialog(about_facts(window.controller.settings, window.controller.model_info), window)
    window.help_dialog = dialog
    window.show_dialog(dialog)
    return dialog
