"""The window's file actions beyond Export… and Import…: "Export all conversations…" in the File menu and
Export in a conversation's context menu, installed on a built MainWindow.

Invariant: like the window, this only asks for paths (through `window.save_export` / `window.pick_folder`,
replaced in tests) and calls the controller (app/exchange_flow.py); it writes nothing itself.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from PySide6.QtGui import QAction

from . import dialogs

if TYPE_CHECKING:
    from .window import MainWindow


def file_stem(title: str) -> str:
    return "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in title).strip() or "conversation"


def install_exchange(window: MainWindow) -> None:
    window.pick_folder = partial(dialogs.pick_folder, folders=window.exchange_folders)
    window.export_all_action = QAction("Export all conversations…", window,
                                       toolTip="One Markdown file per conversation, into a folder",
                                       triggered=lambda: export_all(window))
    menu = next((a.menu() for a in window.menuBar().actions() if a.text() == "&File"), None)
    if menu is not None:
        actions = menu.actions()
        after = actions.index(window.export_action) + 1 if window.export_action in actions else len(actions)
        menu.insertAction(actions[after] if after < len(actions) else None, window.export_all_action)
    window.sidebar.exportRequested.connect(lambda conversation_id, title: export_one(window, conversation_id, title))


def export_one(window: MainWindow, conversation_id: str, title: str) -> None:
    """Export the conversation the context menu was opened on (open or not) to a file the user picks."""
    path = window.save_export(window, f"{file_stem(title)}.md")
    if path:
        window.controller.export_conversation(path, conversation_id)


def export_all(window: MainWindow) -> None:
    folder = window.pick_folder(window)
    if folder:
        window.controller.export_all(folder)
