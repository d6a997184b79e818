"""Help → Keyboard shortcuts and Help → About: what the window's keys do; version, model, device, data folder,
settings file and log file.

Invariants: the shortcut list is read from the window's own actions (a key added to an action is listed, never a
second table to keep in step) plus the keys widgets handle themselves (`WIDGET_KEYS`); the dialogs only show.
"""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from evoke_engine import logs

from .messages import model_name

# keys handled inside widgets (no QAction carries them)
WIDGET_KEYS = (("Enter", "Send the message"), ("Shift+Enter", "A new line in the message"),
               ("F2", "Rename the selected conversation (list)"), ("Del", "Delete the selected conversation (list)"),
               ("Ctrl+Wheel", "Bigger or smaller text (over the chat)"))


def app_version() -> str:
    return logs.app_version()


def shortcut_rows(actions: list[QAction]) -> list[tuple[str, str]]:
    """(key, what it does) for every action with a shortcut, then the widgets' own keys; each key once."""
    rows: list[tuple[str, str]] = []
    for action in actions:
        key = action.shortcut().toString(QKeySequence.SequenceFormat.NativeText)
        what = action.text().replace("&", "").rstrip("…").strip()
        if key and what and key not in {k for k, _ in rows}:
            rows.append((key, what))
    return rows + [row for row in WIDGET_KEYS if row[0] not in {k for k, _ in rows}]


class ShortcutsDialog(QDialog):
    def __init__(self, rows: list[tuple[str, str]], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Keyboard shortcuts")
        self.setObjectName("shortcutsDialog")
        col = QVBoxLayout(self)
        self.table = QTableWidget(len(rows), 2, self)
        self.table.setHorizontalHeaderLabels(["Key", "Action"])
        self.table.verticalHeader().hide()
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        for i, (key, what) in enumerate(rows):
            self.table.setItem(i, 0, QTableWidgetItem(key))
            self.table.setItem(i, 1, QTableWidgetItem(what))
        self.table.resizeColumnsToContents()
        col.addWidget(self.table)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        col.addWidget(buttons)
        self.resize(460, 420)

    def rows(self) -> list[tuple[str, str]]:
        return [(self.table.item(i, 0).text(), self.table.item(i, 1).text()) for i in range(self.table.rowCount())]


def about_facts(settings: Any, model_info: Any) -> list[tuple[str, str]]:
    """(what, value) lines of the About dialog; the model and device say so when none is loaded."""
    loaded = model_info is not None
    return [("Version", app_version()),
            ("Model", model_name(model_info) if loaded else "none loaded"),
            ("Device", str(getattr(model_info, "device", "") or "?") if loaded else "none (no model loaded)"),
            ("Data folder", str(settings.data_dir)),
            ("Settings", str(settings.config_dir / "settings.json")),
            ("Log file", str(logs.log_file(getattr(settings, "home", None))))]


class AboutDialog(QDialog):
    def __init__(self, facts: list[tuple[str, str]], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("About Evoke Desk")
        self.setObjectName("aboutDialog")
        self.facts = facts
        col = QVBoxLayout(self)
        lines = "".join(f"<tr><td><b>{html.escape(k)}</b>&nbsp;&nbsp;</td><td>{html.escape(v)}</td></tr>"
                        for k, v in facts)
        self.label = QLabel("<h3>Evoke Desk</h3><p>A local coding chat: llama.cpp in-process, its KV cache managed "
                            f"like operating-system memory.</p><table>{lines}</table>")
        self.label.setTextInteractionFlags(self.label.textInteractionFlags().TextSelectableByMouse)
        self.label.setWordWrap(True)
        col.addWidget(self.label)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        col.addWidget(buttons)
