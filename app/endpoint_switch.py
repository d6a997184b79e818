"""The endpoint switch of the window: starts, restarts or stops the OpenAI-compatible server when the
settings say so (applied at once) and reports its address for the status bar.

Invariants: at most one server runs; it serves the window's own engine; a failure to start (port in
use, a non-loopback address) is reported and leaves the endpoint off. No policy here: the server owns it.
"""

from __future__ import annotations

import logging
from typing import Any

from PySide6.QtCore import QObject, Signal

log = logging.getLogger(__name__)


class EndpointSwitch(QObject):
    addressChanged = Signal(str)          # "" when off
    failed = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.server: Any = None
        self._key: tuple | None = None

    def apply(self, engine: Any, settings: Any) -> None:
        want = (settings.server_host, settings.server_port, settings.api_key,
                settings.server_max_request_bytes) if (
            engine is not None and getattr(settings, "server_enabled", False)) else None
        if want == self._key:
            return
        self.stop()
        if want is None:
            return
        from evoke_engine.server import EndpointServer, ServerConfig

        try:
            server = EndpointServer(engine, ServerConfig(host=want[0], port=want[1], api_key=want[2] or None,
                                                           max_request_bytes=want[3]))
        except (OSError, ValueError) as exc:
            self.failed.emit(f"The API endpoint could not start on {want[0]}:{want[1]}: {exc}")
            return
        self.server, self._key = server.start(), want
        self.addressChanged.emit(server.address)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server, self._key = None, None
            self.addressChanged.emit("")
