"""Running the endpoint: `EndpointServer` (uvicorn on its own thread, for the app and tests) and `serve`
(headless, `evoke-desk serve` / `python -m evoke_engine serve`).

Invariants: the bind is checked (`ServerConfig.check_bind`) before any socket opens; `stop` returns once
the server has closed; a server given `lifetime_s` stops by itself after that long.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import threading
import time

import uvicorn

from ..engine import Engine
from .app import create_app
from .security import ServerConfig

log = logging.getLogger(__name__)


class EndpointServer:
    def __init__(self, engine: Engine, config: ServerConfig, *, lifetime_s: float | None = None) -> None:
        self.config = config
        self.warning = config.check_bind()
        self.app = create_app(engine, config)
        self._sock = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((config.host, config.port))
        self.port = self._sock.getsockname()[1]        # the real port when 0 (ephemeral) was asked
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="off",
                                                     timeout_graceful_shutdown=5))
        self._thread: threading.Thread | None = None
        self._timer = threading.Timer(lifetime_s, self.stop) if lifetime_s else None

    @property
    def address(self) -> str:
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.port}/v1"

    def start(self) -> EndpointServer:
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="evoke-endpoint", daemon=True)
        self._thread.start()
        if self._timer is not None:
            self._timer.daemon = True
            self._timer.start()
        return self

    def wait_started(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while (not self._server.started and self._thread is not None and self._thread.is_alive()
               and time.monotonic() < deadline):
            time.sleep(0.02)
        return self._server.started

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        if self._timer is not None:
            self._timer.cancel()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        with contextlib.suppress(OSError):
            self._sock.close()

    def __enter__(self) -> EndpointServer:
        self.start()
        self.wait_started()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(engine: Engine, config: ServerConfig) -> int:
    """Serve until interrupted (the calling thread runs uvicorn)."""
    try:
        server = EndpointServer(engine, config)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if server.warning:
        print(server.warning, file=sys.stderr)
    key_note = "an API key is required" if config.api_key else "no API key"
    print(f"Evoke Desk endpoint on {server.address} ({key_note}); Ctrl-C stops it", flush=True)
    with contextlib.suppress(KeyboardInterrupt):       # uvicorn re-raises the Ctrl-C it shut down on
        server._server.run(sockets=[server._sock])
    print("endpoint stopped", flush=True)
    return 0
