"""One window per data folder: a second start asks the first to come to the front (a local socket named after the
data folder) and exits, instead of opening read-only beside it.

Invariants: the socket name is derived from the resolved data folder only (two folders, two windows); the second
start exits only after the first answered `ACTIVATED`; when nothing answers within `ANSWER_TIMEOUT_MS` (no first
window, or one that hangs) the caller goes on as before (the data-folder lock then decides, read-only if taken);
a stale socket left by a crashed window is removed before listening.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from PySide6.QtCore import QObject, Qt
from PySide6.QtNetwork import QLocalServer, QLocalSocket
from PySide6.QtWidgets import QWidget

log = logging.getLogger(__name__)
ACTIVATE = b"activate\n"
ACTIVATED = b"activated\n"
ANSWER_TIMEOUT_MS = 2000


def server_name(data_dir: Path) -> str:
    digest = hashlib.sha256(str(Path(data_dir).resolve()).encode()).hexdigest()[:16]
    return f"evoke-desk-{digest}"


def activate_running(data_dir: Path, timeout_ms: int = ANSWER_TIMEOUT_MS) -> bool:
    """Ask the window that owns `data_dir` to come to the front; True when it answered."""
    sock = QLocalSocket()
    sock.connectToServer(server_name(data_dir))
    if not sock.waitForConnected(timeout_ms):
        return False
    try:
        sock.write(ACTIVATE)
        sock.flush()
        answer = b""
        while ACTIVATED not in answer and sock.waitForReadyRead(timeout_ms):
            answer += bytes(sock.readAll().data())
        return ACTIVATED in answer
    finally:
        sock.disconnectFromServer()


class InstanceServer(QObject):
    """The first window's side: brings `window` to the front when another start asks."""

    def __init__(self, data_dir: Path, window: QWidget) -> None:
        super().__init__(window)
        self.window = window
        self.name = server_name(data_dir)
        self.server = QLocalServer(self)
        self.server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        if not self.server.listen(self.name):
            QLocalServer.removeServer(self.name)          # a crashed window's socket file: nobody answered on it
            if not self.server.listen(self.name):
                log.warning("single instance: cannot listen on %s: %s", self.name, self.server.errorString())
        self.server.newConnection.connect(self._connected)

    @property
    def listening(self) -> bool:
        return self.server.isListening()

    def _connected(self) -> None:
        while (sock := self.server.nextPendingConnection()) is not None:
            sock.readyRead.connect(lambda s=sock: self._read(s))
            sock.disconnected.connect(sock.deleteLater)

    def _read(self, sock: QLocalSocket) -> None:
        if ACTIVATE.strip() not in bytes(sock.readAll().data()):
            return
        self.bring_to_front()
        sock.write(ACTIVATED)
        sock.flush()

    def bring_to_front(self) -> None:
        window = self.window
        window.setWindowState((window.windowState() & ~Qt.WindowState.WindowMinimized) | Qt.WindowState.WindowActive)
        window.show()
        window.raise_()
        window.activateWindow()
        log.info("another start asked for this window: brought to the front")
