"""Modal questions behind plain functions, so the window's logic runs headless in tests.

Invariant: the window calls these through its own attributes (`confirm`, `ask_text`,
`pick_files`), which tests replace; nothing else opens a modal dialog.
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
