"""Versions of the shown messages (another one made current, with its branch), and the undo of a message's
delete, from the window.

Invariants: versions are keyed by the view's positions at the time they land (a list that arrives for another
conversation is dropped); a version is made current through the engine (SQLite first, then the KV), never while a
reply streams, and the view is then read back from the history; one delete can be undone, in the conversation it
was made in, until another conversation opens; the undo goes through the engine (rows back, KV rebuilt from SQLite).
"""

from __future__ import annotations

import logging
from typing import Any

from .bridge import error_text
from .messages import Versions

log = logging.getLogger(__name__)
DELETED_NOTE = "Message deleted."


class VersionsFlow:
    """Mixed into ChatController (uses its bridge, conv, messages, `_can_edit`, `_history` and signals)."""

    undoable: tuple[Any, list[int]] | None = None       # (conversation handle, deleted row ids)

    # -- versions -------------------------------------------------------------------------------
    def load_versions(self, conv: Any) -> None:
        """Ask for the versions of the shown messages; `versionsChanged({position: Versions})` follows."""
        if conv is None or not hasattr(conv, "versions"):
            return
        self.bridge.call(conv.versions, on_done=lambda versions: self._versions_loaded(conv, versions),
                         on_error=lambda exc: log.warning("reading message versions: %s", error_text(exc)))

    def _versions_loaded(self, conv: Any, versions: dict[int, list[dict[str, Any]]]) -> None:
        if conv is not self.conv:
            return
        shown = {}
        for position, message in enumerate(self.messages):
            if message.row_id in versions:
                rows = versions[message.row_id]
                ids = tuple(int(v["id"]) for v in rows)
                shown[position] = Versions(tuple(v["text"] for v in rows), ids,
                                           ids.index(message.row_id) if message.row_id in ids else len(ids) - 1)
        self.versionsChanged.emit(shown)

    def switch_version(self, position: int, row_id: int) -> bool:
        """Make version `row_id` of message `position` current: the messages below it become that version's
        branch, and the view is read back from the history. False when nothing can change now."""
        if not self._can_edit() or not 0 <= position < len(self.messages):
            self.load_versions(self.conv)                   # the switch that asked waits no more
            return False
        conv = self.conv

        def failed(exc: BaseException) -> None:
            self.errorRaised.emit(f"Could not switch to that version: {error_text(exc)}")
            self.reload_history(conv)
        self.bridge.call(conv.switch_version, row_id, on_done=lambda _: self.reload_history(conv), on_error=failed)
        return True

    def reload_history(self, conv: Any) -> None:
        """Show the conversation's messages again as SQLite has them now (after a change below the view)."""
        self.bridge.call(conv.messages, on_done=lambda rows: self._history(conv, rows), on_error=self._fail)
        self.refresh_stats()

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
