"""The SQLite row of a reply while it streams, so a crash (kill -9) loses at most the last second of it.

Invariants: the row is created at the reply's first piece, flagged `interrupted` (`store.history.INTERRUPTED`),
and rewritten at most once per `interval_s` with the text so far; those writes run on the reply's own writer thread
(a commit's fsync never stalls the token stream), the newest text replacing one not yet written, and `flush` waits
for them: once flushed, the row holds every piece handed on more than `interval_s` earlier. Writes while streaming
are best effort (a failure is reported once, on the streaming thread, and the reply goes on); `finish` flushes,
writes the final text unflagged and raises when it cannot, with the reply's speed under `extra["metrics"]`
(`reply_metrics`), so its footer is shown again after a restart. `row_id` is read settled (it flushes first). A
continued reply (`row_id` and `text` given) grows its own row: the same message, never a new one.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import EvokeError
from ..store.history import INTERRUPTED, HistoryDB
from ..store.store_error import StoreError

log = logging.getLogger(__name__)

WRITE_INTERVAL_S = 1.0
WRITE_ERRORS = (StoreError, sqlite3.Error, OSError)
METRICS = "metrics"      # the `extra` key of a finished reply's row: {tokens, tokens_per_s, ttft_s, stopped, breakdown}


def reply_metrics(reply: Any) -> dict[str, Any]:
    """The `extra` of a finished reply's row: what its footer shows (tokens, tok/s, first token, why it stopped)."""
    # unrounded: JSON keeps a float exactly, so the footer after a restart formats the very figure the live one did
    # (a stored 37.95 from a live 37.9499 read "38.0" where the live footer read "37.9")
    metrics = {"tokens": int(reply.n_tokens), "tokens_per_s": float(reply.tokens_per_s),
               "ttft_s": float(reply.ttft_s), "stopped": str(reply.stopped)}
    if getattr(reply, "breakdown", None):               # where the turn's time went (conversations.breakdown)
        metrics["breakdown"] = dict(reply.breakdown)
    return {METRICS: metrics}


class ReplySaveError(EvokeError):
    """The reply's row could not be written at the end of its turn (a full disk, a locked database)."""


class StreamedReply:
    """One reply's row; `on_token` is the turn's token callback (it forwards every piece to `forward`)."""

    def __init__(self, history: HistoryDB, conversation_id: str, *, previous_id: int | None = None,
                 forward: Callable[[str], None] | None = None,
                 on_error: Callable[[Exception], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, interval_s: float = WRITE_INTERVAL_S,
                 row_id: int | None = None, text: str = "") -> None:
        self.history = history
        self.conversation_id = conversation_id
        self.previous_id = previous_id
        self.forward = forward
        self.on_error = on_error
        self.clock = clock
        self.interval_s = interval_s
        self._row_id: int | None = row_id        # given: a continued reply's own row
        self.text = text
        self.writes = 0
        self._written_at: float | None = None
        self._failed: Exception | None = None     # the first failed write while streaming, until it is reported
        self._reported = False
        self._pending: str | None = None          # the newest text handed to the writer, not yet written
        self._busy = False
        self._cond = threading.Condition()
        self._writer: threading.Thread | None = None
        self._finished = False

    @property
    def row_id(self) -> int | None:
        """The reply's message id once written (None before its first write, or when that failed)."""
        self.flush()
        return self._row_id

    def on_token(self, piece: str) -> None:
        self.text += piece
        now = self.clock()
        if self._written_at is None or now - self._written_at >= self.interval_s:
            self._written_at = now                   # a failed write is retried at the same bounded rate
            self._hand_over(self.text)
        self._report_failure()
        if self.forward is not None:
            self.forward(piece)

    def flush(self) -> None:
        """Wait until every text handed to the writer is written (or has failed)."""
        with self._cond:
            while self._pending is not None or self._busy:
                self._cond.wait()
        self._report_failure()

    def finish(self, text: str, extra: dict[str, Any] | None = None) -> None:
        """Write the reply's final text, no longer flagged, with `extra` (its metrics) (`row_id` names it);
        ReplySaveError when it fails."""
        self.flush()
        with self._cond:                             # the writer thread, if any, ends now
            self._finished = True
            self._cond.notify_all()
        try:
            self._write(text, dict(extra or {}))
        except WRITE_ERRORS as exc:
            raise ReplySaveError(f"the reply could not be saved ({exc}); the turn was rolled back: "
                                 "its message is not in the history, send it again") from exc

    def _hand_over(self, text: str) -> None:
        with self._cond:
            self._pending = text
            if self._writer is None:                 # it clears this, under the lock, as it ends
                self._writer = threading.Thread(target=self._write_pending, name="evoke-reply-row", daemon=True)
                self._writer.start()
            self._cond.notify_all()

    def _write_pending(self) -> None:
        """The writer thread: write the newest handed-over text, flagged interrupted, until none waits; it ends
        at `finish`, or after two `interval_s` with nothing handed over (the next write starts another)."""
        while True:
            with self._cond:
                if self._pending is None and not self._finished:
                    self._cond.wait(timeout=max(self.interval_s, 0.05) * 2)
                if self._pending is None:
                    self._writer = None
                    return
                text, self._pending, self._busy = self._pending, None, True
            try:
                self._write(text, {INTERRUPTED: True})
            except WRITE_ERRORS as exc:
                if self._failed is None:
                    self._failed = exc
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _report_failure(self) -> None:
        """A failed write while streaming, reported once, on the thread that streams."""
        exc = self._failed
        if exc is None or self._reported:
            return
        self._reported = True
        log.warning("reply of %s not saved while streaming: %s", self.conversation_id, exc)
        if self.on_error is not None:
            self.on_error(exc)

    def _write(self, text: str, extra: dict) -> None:
        if self._row_id is None:
            self._row_id = self.history.add_message(self.conversation_id, "assistant", text,
                                                    previous_id=self.previous_id, extra=extra)
        else:
            self.history.update_message(self.conversation_id, self._row_id, text, extra=extra)
        self.writes += 1
