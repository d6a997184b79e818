"""Where the app's resources are (installed package, source tree or PyInstaller bundle): icons, style sheet, demo files.

Invariant: read-only; a missing icon gives an empty QIcon, never an exception.
"""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

from PySide6.QtGui import QIcon

from evoke_engine.package_files import resources_path


def resources_dir() -> Path:
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle:
        return Path(bundle) / "resources"
    return resources_path()                 # the installed evoke_resources package, else the checkout's folder


@cache
def icon(name: str) -> QIcon:
    path = resources_dir() / "icons" / f"{name}.svg"
    return QIcon(str(path)) if path.exists() else QIcon()


def stylesheet() -> str:
    """The style sheet, with @ICONS@ replaced by the icons folder (QSS urls are not file-relative)."""
    path = resources_dir() / "style.qss"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    return text.replace("@ICONS@", (resources_dir() / "icons").as_posix())


def demo_file(name: str) -> Path:
    return resources_dir() / "demo" / name
