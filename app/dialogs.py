"""Modal questions behind plain functions, so the window's logic runs headless in tests.

Invariant: the window calls these through its own attributes (`confirm`, `ask_text`, `edit_text`,
`pick_files`, `save_export`, `pick_import`), which tests replace; nothing else opens a modal dialog.
"""

from __future__ import annotations

from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox, QWidget


def confirm(parent: QWidget, title: str, text: str, yes: str = "Yes") -> bool:
    box = QMessageBox(QMessageBox.Icon.Question, title, text, parent=parent)
    ok = box.addButton(yes, QMessageBox.ButtonRole.AcceptRole)
    box.addButton(QMessageBox.StandardButton.Cancel)
    box.exec()
    return box.clickedButton() is ok


def ask_text(parent: QWidget, title: str, label: str, text: str = "") -> str | None:
    value, ok = QInputDialog.getText(parent, title, label, text=text)
    return value if ok else None


def pick_files(parent: QWidget) -> list[str]:
    paths, _ = QFileDialog.getOpenFileNames(parent, "Attach text files", "",
                                            "Text and code (*.txt *.md *.py *.js *.ts *.json *.toml *.yaml "
                                            "*.yml *.c *.h *.cpp *.rs *.go *.java *.sh *.cfg *.ini);;All files (*)")
    return paths


def edit_text(parent: QWidget, title: str, label: str, text: str = "") -> str | None:
    value, ok = QInputDialog.getMultiLineText(parent, title, label, text)
    return value if ok else None


EXPORT_FILTERS = "Markdown (*.md);;JSON (*.json)"


def save_export(parent: QWidget, suggested: str) -> str:
    """A path for an export; the suffix names the format (.json, else Markdown)."""
    path, chosen = QFileDialog.getSaveFileName(parent, "Export conversation", suggested, EXPORT_FILTERS)
    if path and "." not in path.rsplit("/", 1)[-1]:
        path += ".json" if chosen.startswith("JSON") else ".md"
    return path


def pick_import(parent: QWidget) -> str:
    path, _ = QFileDialog.getOpenFileName(parent, "Import conversation", "", "JSON (*.json);;All files (*)")
    return path
