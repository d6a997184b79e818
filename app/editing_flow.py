"""Conversation editing from the window: regenerate, edit, fork and delete (files: app/exchange_flow.py).

Invariants: the view names a message by its position in `messages`; only here is it mapped to
the engine's live-message index (`ChatMessage.index`). Regenerate, a user message's edit and Continue generating
stream through the same path as `send` (a continued reply grows its own bubble); a reply's edit only replaces its
text (no new reply); nothing is edited while a reply streams.
"""

from __future__ import annotations

import logging
from typing import Any

from .bridge import error_text
from .messages import ChatMessage

log = logging.getLogger(__name__)


class EditingFlow:
    """Mixed into ChatController (uses its bridge, conv, messages, streaming path and signals)."""

    def _can_edit(self) -> bool:
        if self.conv is None or self.generating:
            return False
        return self.model_state in ("ready", "unloaded")

    def _engine_index(self, position: int) -> int | None:
        if not 0 <= position < len(self.messages):
            return None
        index = self.messages[position].index
        if index < 0:
            self.errorRaised.emit("That message is not saved yet; try again in a moment.")
            return None
        return index

    def reindex(self, conv: Any, rows: list[dict[str, Any]]) -> None:
        """Give the shown messages the engine's indexes (in order; ones past the history get -1)."""
        if conv is not self.conv:
            return
        live = [i for i, r in enumerate(rows) if r.get("role") in ("user", "assistant")]
        for position, message in enumerate(self.messages):
            message.index = live[position] if position < len(live) else -1
            message.row_id = int(rows[live[position]].get("id", -1)) if position < len(live) else -1
        self.load_versions(conv)

    def _reload_indexes(self, conv: Any) -> None:
        self.bridge.call(conv.messages, on_done=lambda rows: self.reindex(conv, rows),
                         on_error=lambda exc: log.warning("reading the history: %s", exc))

    # -- regenerate and edit stream like a send -------------------------------------------------
    def regenerate(self, **options: Any) -> bool:
        """Replace the last reply by a new one, streamed; False when there is none to replace now."""
        if not self._can_edit() or not self.messages or self.messages[-1].role != "assistant":
            return False
        conv = self.conv
        self.messagesTruncated.emit(len(self.messages) - 1)
        self.messages[-1] = ChatMessage("assistant", "", index=self.messages[-1].index)
        self.messageAdded.emit(self.messages[-1])
        self._stream_reply(conv, conv.regenerate, **options)
        return True

    def continue_reply(self, **options: Any) -> bool:
        """Go on writing the last reply from where it stopped, streamed into the same message; False when the last
        message is no reply or nothing can be sent now."""
        if not self._can_edit() or not self.messages or self.messages[-1].role != "assistant":
            return False
        if (index := self._engine_index(len(self.messages) - 1)) is None:
            return False
        conv, last = self.conv, self.messages[-1]
        self.messagesTruncated.emit(len(self.messages) - 1)
        self.messages[-1] = ChatMessage("assistant", last.text, index=index, created_at=last.created_at,
                                        row_id=last.row_id)
        self.messageAdded.emit(self.messages[-1])
        self._stream_reply(conv, conv.continue_reply, **options)
        if self.stream is not None:
            self.stream.text = last.text                # the new pieces follow the text it had
        return True

    def edit_message(self, position: int, text: str, **options: Any) -> bool:
        """Replace user message `position` by `text` (later messages go to the old version's branch) and stream
        the new reply; a reply's text is replaced as it is (`edit_reply`)."""
        text = text.strip()
        if not text or not self._can_edit() or not 0 <= position < len(self.messages):
            return False
        old = self.messages[position]
        if old.role == "assistant":
            return self.edit_reply(position, text)
        if old.role != "user" or (index := self._engine_index(position)) is None:
            return False
        conv = self.conv
        user = ChatMessage("user", text, list(old.attachments), index=index)
        self.messages[position:] = [user, ChatMessage("assistant", "", index=index + 1)]
        self.messagesTruncated.emit(position)
        self.messageAdded.emit(user)
        self.messageAdded.emit(self.messages[-1])
        self._stream_reply(conv, conv.edit, index, text, **options)
        return True

    def edit_reply(self, position: int, text: str) -> bool:
        """Replace reply `position`'s text (a new version of it; the messages after it go to the old one's
        branch); the view is read back from the history when the engine has it."""
        if not self._can_edit() or (index := self._engine_index(position)) is None:
            return False
        conv = self.conv
        self.bridge.call(conv.edit_reply, index, text, on_done=lambda _: self.reload_history(conv),
                         on_error=lambda exc: self._fail_with("Could not edit the reply", exc))
        return True

    # -- fork and delete ------------------------------------------------------------------------
    def fork_message(self, position: int) -> bool:
        """Open a new conversation holding the messages up to `position` (its cache shared)."""
        if not self._can_edit() or (index := self._engine_index(position)) is None:
            return False
        self.bridge.call(self.conv.fork, index, on_done=self._opened, on_error=self._fail)
        return True

    def delete_message(self, position: int) -> bool:
        if not self._can_edit() or (index := self._engine_index(position)) is None:
            return False
        conv, row_id = self.conv, self.messages[position].row_id

        def done(_: Any) -> None:
            self.bridge.call(conv.messages, on_done=lambda rows: self._history(conv, rows), on_error=self._fail)
            self.refresh_stats()
            if row_id >= 0:
                self.offer_undo(conv, [row_id])
        self.bridge.call(conv.delete_message, index, on_done=done, on_error=self._fail)
        return True

    def _fail_with(self, what: str, exc: BaseException) -> None:
        self.errorRaised.emit(f"{what}: {error_text(exc)}")
