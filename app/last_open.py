"""The conversation the window showed last, kept across restarts, and the choice of what opens at start-up.

Invariants: one small text file under the config folder holding one conversation id, private like every file of
the app (0600 in a 0700 folder whatever the umask, written atomically); a missing or unreadable
file reads as none and a failed write is logged, never raised (it only saves a click); the start-up choice is
the conversation read while the model loaded, else the remembered one if it still exists, else the first listed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from evoke_engine import private_mkdir, private_write_text

log = logging.getLogger(__name__)
FILE_NAME = "last_conversation"


class LastConversation:
    def __init__(self, config_dir: Path | str) -> None:
        self.path = Path(config_dir) / FILE_NAME
        self._written = ""

    def recall(self) -> str:
        try:
            return self.path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return ""

    def remember(self, conversation_id: str) -> None:
        if not conversation_id or conversation_id == self._written:
            return
        try:
            private_mkdir(self.path.parent)
            private_write_text(self.path, conversation_id)
            self._written = conversation_id
        except OSError as error:
            log.warning("could not remember the open conversation in %s: %s", self.path, error)


def startup_choice(ids: Sequence[str], viewed_id: str, remembered: str) -> str | None:
    """The conversation to open at start-up among `ids` (as listed); None when there is none."""
    for candidate in (viewed_id, remembered):
        if candidate and candidate in ids:
            return candidate
    return ids[0] if ids else None
