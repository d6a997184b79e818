"""Earlier versions of the shown messages, and the undo of a message's delete, from the window.

Invariants: versions are read-only and keyed by the view's positions at the time they land (a list that
arrives for another conversation is dropped); one delete can be undone, in the conversation it was made in,
until another conversation opens; the undo goes through the engine (rows back, KV rebuilt from SQLite).
"""

from __future__ import annotations

import logging
from typing import Any

from .bridge import error_text

log = logging.getLogger(__name__)
DELETED_NOTE = "Message deleted."


class VersionsFlow:
    """Mixed into ChatController (uses its bridge, conv, messages, `_can_edit`, `_history` and signals)."""

    undoable: tuple[Any, list[int]] | None = None       # (conversation handle, deleted row ids)

    # -- versions -------------------------------------------------------------------------------
    def load_versions(self, conv: Any) -> None:
        """Ask for the versions of the shown messages; `versionsChanged({position: [text, ...]})` follows."""
        if conv is None or not hasattr(conv, "versions"):
            return
        self.bridge.call(conv.versions, on_done=lambda versions: self._versions_loaded(conv, versions),
                         on_error=lambda exc: log.warning("reading message versions: %s", error_text(exc)))

    def _versions_loaded(self, conv: Any, versions: dict[int, list[dict[str, Any]]]) -> None:
        if conv is not self.conv:
            return
        shown = {position: [v["text"] for v in versions[m.row_id]]
                 for position, m in enumerate(self.messages) if m.row_id in versions}
        self.versionsChanged.emit(shown)

    # -- undo of a delete -----------------------------------------------------------------------
    def offer_undo(self, conv: Any, row_ids: list[int]) -> None:
        self.undoable = (conv, list(row_ids))
        self.undoChanged.emit(DELETED_NOTE)

    def drop_undo(self) -> None:
        if self.undoable is not None:
            self.undoable = None
            self.undoChanged.emit("")

    def undo_delete(self) -> bool:
        """Bring the last deleted message back; False when there is none to bring back now."""
        if self.undoable is None or not self._can_edit():
            return False
        conv, ids = self.undoable
        self.drop_undo()
        if conv is not self.conv:
            return False

        def done(_: Any) -> None:
            self.bridge.call(conv.messages, on_done=lambda rows: self._history(conv, rows), on_error=self._fail)
            self.refresh_stats()
        self.bridge.call(conv.undelete, ids, on_done=done,
                         on_error=lambda exc: self.errorRaised.emit(f"Could not undo the delete: {error_text(exc)}"))
        return True
