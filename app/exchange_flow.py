"""Conversations as files from the window: export one (the open one or any in the list), export all into a
folder, import one or several files (Markdown or JSON, whatever the export wrote).

Invariants: files are read and written on the bridge's thread, never the GUI thread; the format follows the
path's suffix (.json, else Markdown); an import opens the last file that imported and names every file that
did not, without changing the open conversation for those.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evoke_engine.errors import EvokeError


def export_format(path: str) -> str:
    return "json" if Path(path).suffix.lower() == ".json" else "markdown"


class ExchangeFlow:
    """Mixed into ChatController (uses its bridge, engine, conv, `_opened`, `_fail_with` and `exported`)."""

    def export_conversation(self, path: str, conversation_id: str | None = None) -> bool:
        """Write a conversation (the open one by default) to `path`: JSON for a .json suffix, else Markdown."""
        conversation_id = conversation_id or (str(self.conv.id) if self.conv is not None else "")
        if not path or not conversation_id or self.engine is None:
            return False
        engine, fmt = self.engine, export_format(path)

        def write() -> str:
            Path(path).write_text(engine.export(conversation_id, fmt), encoding="utf-8")
            return path
        self.bridge.call(write, on_done=self.exported.emit, on_error=self._fail)
        return True

    def export_all(self, folder: str, format: str = "markdown") -> bool:
        """Every conversation into `folder`, one file each; `exported` says where and how many."""
        if not folder or self.engine is None:
            return False
        engine = self.engine

        def write() -> str:
            paths = engine.export_all(folder, format)
            return f"{folder} ({len(paths)} conversation{'s' if len(paths) != 1 else ''})"
        self.bridge.call(write, on_done=self.exported.emit,
                         on_error=lambda exc: self._fail_with(f"Could not export to {folder}", exc))
        return True

    def import_conversation(self, path: str) -> bool:
        return self.import_conversations([path])

    def import_conversations(self, paths: Sequence[str]) -> bool:
        """Import each file (as `export` wrote it, Markdown or JSON) and open the last that imported."""
        paths = [p for p in paths if p]
        if not paths or not self._engine_or_say():
            return False
        engine = self.engine

        def read_all() -> tuple[list[Any], list[tuple[str, BaseException]]]:
            imported, failed = [], []
            for path in paths:
                try:
                    imported.append(engine.import_conversation(Path(path).read_bytes()))
                except (OSError, EvokeError) as exc:
                    failed.append((path, exc))
            return imported, failed

        def done(result: tuple[list[Any], list[tuple[str, BaseException]]]) -> None:
            imported, failed = result
            if imported:
                self._opened(imported[-1])
                self.refresh_conversations()
            for path, exc in failed:
                self._fail_with(f"Could not import {Path(path).name}", exc)
        self.bridge.call(read_all, on_done=done, on_error=lambda exc: self._fail_with("Could not import", exc))
        return True
