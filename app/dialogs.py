"""Modal questions behind plain functions, so the window's logic runs headless in tests.

Invariant: the window calls these through its own attributes (`confirm`, `ask_text`, `edit_text`,
`pick_files`, `save_export`, `pick_import`, `pick_folder`), which tests replace; nothing else opens a modal dialog.
The import and export dialogs open in the folder last used for either (`FolderMemory`, kept in the window's
QSettings file across restarts), else in the home folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)


def confirm(parent: QWidget, title: str, text: str, yes: str = "Yes") -> bool:
    box = QMessageBox(QMessageBox.Icon.Question, title, text, parent=parent)
    ok = box.addButton(yes, QMessageBox.ButtonRole.AcceptRole)
    box.addButton(QMessageBox.StandardButton.Cancel)
    box.exec()
    return box.clickedButton() is ok


class TextDialog(QDialog):
    """A one-line question wide enough for its whole title (window managers cut a narrow one)."""

    def __init__(self, parent: QWidget | None, title: str, label: str, text: str = "") -> None:
        super().__init__(parent)
        self.setWindowTitle(title)
        col = QVBoxLayout(self)
        col.addWidget(QLabel(label))
        self.line = QLineEdit(text)
        self.line.selectAll()
        col.addWidget(self.line)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        col.addWidget(buttons)
        self.setMinimumWidth(max(440, self.fontMetrics().horizontalAdvance(title) + 200))

    def textValue(self) -> str:  # noqa: N802 - QInputDialog's name
        return self.line.text()


def ask_text(parent: QWidget, title: str, label: str, text: str = "") -> str | None:
    dialog = TextDialog(parent, title, label, text)
    return dialog.textValue() if dialog.exec() == QDialog.DialogCode.Accepted else None


def pick_files(parent: QWidget) -> list[str]:
    paths, _ = QFileDialog.getOpenFileNames(parent, "Attach text files", "",
                                            "Text and code (*.txt *.md *.py *.js *.ts *.json *.toml *.yaml "
                                            "*.yml *.c *.h *.cpp *.rs *.go *.java *.sh *.cfg *.ini);;All files (*)")
    return paths


class EditDialog(QDialog):
    """A roomy editor for a message: the lines wrap at the window's width, the size follows the screen."""

    def __init__(self, parent: QWidget | None, title: str, label: str, text: str = "") -> None:
        super().__init__(parent)
        self.setWindowTitle(title)
        col = QVBoxLayout(self)
        caption = QLabel(label)
        caption.setWordWrap(True)
        self.editor = QPlainTextEdit(objectName="editMessage")
        self.editor.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.editor.setPlainText(text)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        col.addWidget(caption)
        col.addWidget(self.editor, 1)
        col.addWidget(buttons)
        self.setMinimumSize(520, 320)
        screen = (parent.screen() if parent is not None else self.screen()).availableGeometry()
        self.resize(min(760, int(screen.width() * 0.8)), min(520, int(screen.height() * 0.7)))

    def text(self) -> str:
        return self.editor.toPlainText()


def edit_text(parent: QWidget, title: str, label: str, text: str = "") -> str | None:
    dialog = EditDialog(parent, title, label, text)
    return dialog.text() if dialog.exec() == QDialog.DialogCode.Accepted else None


EXPORT_FILTERS = "Markdown (*.md);;JSON (*.json)"


class FolderMemory:
    """The folder the import/export dialogs last used, in a QSettings file (key `dialogs/exchange_folder`)."""

    KEY = "dialogs/exchange_folder"

    def __init__(self, store_path: Path | str) -> None:
        self.store_path = str(store_path)

    def _store(self) -> QSettings:
        return QSettings(self.store_path, QSettings.Format.IniFormat)

    def folder(self) -> str:
        """The last folder if it still exists, else the home folder."""
        last = str(self._store().value(self.KEY, "") or "")
        return last if last and os.path.isdir(last) else str(Path.home())

    def remember(self, path: str) -> None:
        """Remember the folder of a chosen file (or a chosen folder itself); '' (cancelled) changes nothing."""
        if not path:
            return
        folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
        store = self._store()
        store.setValue(self.KEY, folder)
        store.sync()


def save_export(parent: QWidget, suggested: str, folders: FolderMemory | None = None) -> str:
    """A path for an export; the suffix names the format (.json, else Markdown). Opens in the last folder used."""
    start = os.path.join(folders.folder(), suggested) if folders else suggested
    path, chosen = QFileDialog.getSaveFileName(parent, "Export conversation", start, EXPORT_FILTERS)
    if path and "." not in path.rsplit("/", 1)[-1]:
        path += ".json" if chosen.startswith("JSON") else ".md"
    if folders:
        folders.remember(path)
    return path


IMPORT_FILTERS = ("Conversations (*.md *.markdown *.json);;Markdown (*.md *.markdown);;JSON (*.json);;"
                  "All files (*)")


def pick_import(parent: QWidget, folders: FolderMemory | None = None) -> list[str]:
    """Files to import: what Export or Export all wrote (Markdown or JSON), one or several. Opens in the last
    folder used."""
    paths, _ = QFileDialog.getOpenFileNames(parent, "Import conversations", folders.folder() if folders else "",
                                            IMPORT_FILTERS)
    if folders and paths:
        folders.remember(paths[0])
    return paths


def pick_folder(parent: QWidget, folders: FolderMemory | None = None) -> str:
    """A folder for "Export all conversations" (one Markdown file per conversation goes there). Opens in the last
    folder used."""
    folder = QFileDialog.getExistingDirectory(parent, "Export all conversations into a folder",
                                              folders.folder() if folders else "")
    if folders:
        folders.remember(folder)
    return folder
