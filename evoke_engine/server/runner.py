"""Running the endpoint: `EndpointServer` (uvicorn on its own thread, for the app and tests) and `serve`
(headless, `evoke-desk serve` / `python -m evoke_engine serve`).

Invariants: the bind is checked (`ServerConfig.check_bind`) before any socket opens; `stop` cancels the
generations in flight (their partial replies are kept) and returns once the server has closed; a server given
`lifetime_s` stops by itself after that long; a connection that has not sent a request's headers within
`header_timeout_s` is closed, and one past `max_connections` is refused. uvicorn always runs on its own thread, so
it never installs signal handlers: `serve` owns SIGTERM, SIGINT and SIGHUP (`evoke_engine.shutdown`), stops the
server, closes the engine (which writes every open conversation's KV file) and returns 0.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import threading
import time

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..engine import Engine
from ..shutdown import shutdown_signals, signal_name
from .app import create_app
from .security import ServerConfig

log = logging.getLogger(__name__)


def guarded_protocol(config: ServerConfig) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline for each request's headers and a cap on open connections."""

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > config.max_connections:
                log.warning("endpoint: %d connections open, refusing another", len(self.connections) - 1)
                transport.close()
                return
            self._arm_header_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_deadline()

        def connection_lost(self, exc) -> None:
            deadline = getattr(self, "_header_deadline", None)
            if deadline is not None:
                deadline.cancel()
            super().connection_lost(exc)

        def _arm_header_deadline(self) -> None:
            cycle = self.cycle
            self._header_deadline = self.loop.call_later(config.header_timeout_s, self._headers_late, cycle)

        def _headers_late(self, cycle) -> None:
            if self.cycle is cycle and not self.transport.is_closing():    # no new request began
                self.transport.close()

    return GuardedH11Protocol


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
                                                     timeout_graceful_shutdown=5, http=guarded_protocol(config),
                                                     timeout_keep_alive=5, limit_concurrency=config.max_connections,
                                                     h11_max_incomplete_event_size=64 << 10))
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
        self.app.state.service.cancel_all()          # a stream in flight ends now, with its partial reply kept
        if self._timer is not None:
            self._timer.cancel()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        with contextlib.suppress(OSError):
            self._sock.close()
        self.app.state.service.close()

    def __enter__(self) -> EndpointServer:
        self.start()
        self.wait_started()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(engine: Engine, config: ServerConfig, lifetime_s: float | None = None) -> int:
    """Serve until SIGTERM, SIGINT or SIGHUP, or for `lifetime_s`, then close the engine (every open
    conversation's KV file is written) with the signals still handled; 0 on a clean stop, 2 when the address
    cannot be served."""
    try:
        server = EndpointServer(engine, config)
    except (ValueError, OSError) as exc:
        log.error("cannot serve: %s", exc)
        return 2
    if server.warning:
        print(server.warning, file=sys.stderr)
    stop_requested = threading.Event()
    with shutdown_signals(lambda _signum: stop_requested.set()) as received:
        server.start()
        if not server.wait_started():
            server.stop()
            log.error("the endpoint on %s did not start", server.address)
            return 2
        key_note = "an API key is required" if config.api_key else "no API key"
        print(f"Evoke Desk endpoint on {server.address} ({key_note}); Ctrl-C stops it", flush=True)
        stop_requested.wait(lifetime_s)
        why = signal_name(received[0]) if received else "lifetime over" if lifetime_s else "stopped"
        print(f"stopping the endpoint ({why})", flush=True)
        server.stop()
        engine.close()                # a second signal now changes nothing: the handlers are still ours
    log.info("endpoint stopped (%s)", why)
    print("endpoint stopped", flush=True)
    return 0
