"""How the window ends when the system, not the user, asks: SIGTERM, SIGINT and SIGHUP close it as its close button
would, and a desktop logout (`commitDataRequest`, then `aboutToQuit`) writes the open conversations' KV files first.

Invariants: Python sees a signal while Qt's loop sleeps (the C handler writes to a socket pair that a
`QSocketNotifier` watches: `signal.set_wakeup_fd`); a signal only closes the window and quits the loop, the caller
then closes the engine (every open conversation persisted) and exits 0; the handlers stay installed until
`restore()`, so a second signal during that close does not kill the process half-way.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QSocketNotifier
from PySide6.QtWidgets import QApplication, QWidget

from evoke_engine.shutdown import SHUTDOWN_SIGNALS, signal_name

log = logging.getLogger(__name__)
COMMIT_TIMEOUT_S = 20.0


def persist_open_conversations(engine: Any, timeout_s: float = COMMIT_TIMEOUT_S) -> int:
    """Write the KV file of every conversation open in a slot or RAM (blocks up to `timeout_s`); how many."""
    if engine is None:
        return 0
    written: list[str] = []

    def run() -> None:
        for info in engine.conversations():
            if info.memory in ("slot", "ram") and engine.persist(info.id):
                written.append(info.id)

    worker = threading.Thread(target=run, name="evoke-commit-data", daemon=True)
    worker.start()
    worker.join(timeout_s)
    return len(written)


class ShutdownHandler(QObject):
    """Installed once the window exists; `received` lists the signals that came."""

    def __init__(self, app: QApplication, window: QWidget, engine: Callable[[], Any]) -> None:
        super().__init__(app)
        self.app, self.window, self.engine = app, window, engine
        self.received: list[int] = []
        self._closing = False
        self._wake_read, self._wake_write = socket.socketpair()
        for end in (self._wake_read, self._wake_write):
            end.setblocking(False)
        self._previous_fd = signal.set_wakeup_fd(self._wake_write.fileno(), warn_on_full_buffer=False)
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in SHUTDOWN_SIGNALS}
        self.notifier = QSocketNotifier(self._wake_read.fileno(), QSocketNotifier.Type.Read, self)
        self.notifier.activated.connect(self._woken)
        app.commitDataRequest.connect(self._commit_data)
        app.aboutToQuit.connect(self._about_to_quit)

    def _on_signal(self, signum: int, _frame: Any) -> None:      # Python's handler, on the main thread
        self.received.append(signum)

    def _woken(self, *_: Any) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while self._wake_read.recv(64):
                pass
        if self.received and not self._closing:
            self._closing = True
            log.info("%s received: closing the window (conversations are saved)", signal_name(self.received[-1]))
            self.window.close()
            self.app.quit()

    def _commit_data(self, _manager: Any) -> None:
        """The desktop session is ending: write the KV files now (the session may end this process at once)."""
        count = persist_open_conversations(self.engine())
        log.info("desktop logout: %d open conversation(s) written", count)

    def _about_to_quit(self) -> None:
        if self.window.isVisible():              # the loop ends without a close (logout): close as a user would
            self.window.close()

    def restore(self) -> None:
        """Give back the signal handlers and wake-up descriptor this replaced."""
        self.notifier.setEnabled(False)
        for sig, old in self._previous.items():
            signal.signal(sig, old)
        signal.set_wakeup_fd(self._previous_fd)
        self._wake_read.close()
        self._wake_write.close()
