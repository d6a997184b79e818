"""Running the endpoint: `EndpointServer` (uvicorn on its own thread, for the app and tests) and `serve`
(headless, `evoke-desk serve` / `python -m evoke_engine serve`).

Invariants: the bind is checked (`ServerConfig.check_bind`) before any socket opens; `stop` cancels the
generations in flight (their partial replies are kept) and returns once the server has closed; a server given
`lifetime_s` stops by itself after that long; a connection that has not sent a request's headers within
`header_timeout_s` is closed, and past `max_connections` the connection idle longest is closed (or, none idle, the new
one answered an OpenAI-shaped 503 with `Retry-After`); a request head with obs-fold, two Content-Length values or
Content-Length with Transfer-Encoding, and any request h11 cannot parse, is answered an OpenAI-shaped 400 and its
connection closed (uvicorn's plain-text 400 is never sent). uvicorn always runs on its own thread, so
it never installs signal handlers: `serve` owns SIGTERM, SIGINT and SIGHUP (`evoke_engine.shutdown`), stops the
server, closes the engine (which writes every open conversation's KV file) and returns 0.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import sys
import threading
import time

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .. import Engine
from ..shutdown import shutdown_signals, signal_name
from .admission import raw_503
from .app import create_app
from .security import HEAD_END, ServerConfig, framing_problem, raw_400

log = logging.getLogger(__name__)


LEADING_BLANK_LINES = re.compile(rb"[\r\n]*")
MAX_HEAD_BYTES = 64 << 10    # h11's largest request head (h11_max_incomplete_event_size below)
REFUSED_LINGER_S = 1.0       # a connection refused past the cap stays half-closed this long, so its 503 is read


def guarded_protocol(config: ServerConfig) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline for each request's headers and a cap on open connections: past the
    cap the connection idle longest (no request under way) is closed to make room, and only when none is idle is
    the new one refused, with an OpenAI-shaped 503 and `Retry-After` (idle connections never lock others out)."""

    class GuardedH11Protocol(H11Protocol):
        idle_since: float | None = None          # when this connection last had no request under way
        refused = False                          # answered 503 at connect; closed after REFUSED_LINGER_S
        head: bytearray | None = None            # the bytes of a request's head so far, while h11 awaits one

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.idle_since = self.loop.time()
            if len(self.connections) > config.max_connections and not self._close_longest_idle():
                log.warning("endpoint: %d connections open, refusing another", len(self.connections) - 1)
                self.refused = True
                transport.write(raw_503(f"the server has {len(self.connections) - 1} connections open, the most "
                                        "it keeps; try again shortly"))
                if transport.can_write_eof():       # half-closed: the request sent meanwhile meets no reset
                    transport.write_eof()
                self.loop.call_later(REFUSED_LINGER_S, transport.close)
                return
            self._arm_header_deadline()

        def data_received(self, data: bytes) -> None:
            if self.refused:                        # answered 503 already: what it sends is not read
                return
            self.idle_since = None
            if self.conn.their_state is not h11.IDLE:       # a body, or a request h11 has parsed: not a head
                self.head = None
            elif not self._head_passes(data):
                return
            super().data_received(data)
            self._refuse_huge_chunk()

        def _refuse_huge_chunk(self) -> None:
            """A chunked body whose next chunk alone is declared larger than the whole body may be (up to 20 hex
            digits pass h11) is refused at once with a 413, not left to time out waiting for its bytes."""
            declared = getattr(getattr(self.conn, "_reader", None), "_bytes_in_chunk", 0)    # h11's chunk reader
            if isinstance(declared, int) and declared > config.max_request_bytes and not self.transport.is_closing():
                log.warning("endpoint: a body chunk of %d bytes declared, refused", declared)
                self.transport.write(raw_400(f"a body chunk of {declared} bytes is larger than the largest request, "
                                             f"{config.max_request_bytes} bytes (the server_max_request_bytes "
                                             "setting)", "request_too_large", b"413 Content Too Large"))
                self.transport.close()

        def _head_passes(self, data: bytes) -> bool:
            """Check the request's head once its blank line has come, before h11 parses it (`framing_problem`:
            obs-fold, two Content-Length values, Content-Length with Transfer-Encoding); False when it was refused
            with an OpenAI-shaped 400 and the connection closed."""
            if self.head is None:
                self.head = bytearray()
            head, seen = self.head, len(self.head)
            head += data                         # in place: a head trickled a byte at a time costs no copies
            start = LEADING_BLANK_LINES.match(head).end()     # RFC 9112 lets a client send CRLFs first
            end = HEAD_END.search(head, max(start, seen - 3))      # only where the new bytes can end it
            if end is None:
                return True                      # more to come (past MAX_HEAD_BYTES h11 refuses it: a shaped 400)
            self.head = None                     # h11 parses it now; the next request's head starts afresh
            problem = framing_problem(bytes(head[start:end.start()]))
            if problem is None:
                return True
            log.warning("endpoint: request refused before parsing: %s", problem)
            self.transport.write(raw_400(problem, "invalid_framing"))
            self.transport.close()
            return False

        def send_400_response(self, msg: str) -> None:
            """h11 could not parse the request: uvicorn's plain-text 400, OpenAI-shaped."""
            self.transport.write(raw_400("the request is not valid HTTP/1.1 (its request line, a header or its "
                                         "body framing is malformed)", "invalid_http"))
            self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self.idle_since = self.loop.time()
            self._arm_header_deadline()

        def _close_longest_idle(self) -> bool:
            idle = [c for c in self.connections if c is not self and getattr(c, "idle_since", None) is not None
                    and not getattr(c, "refused", False) and not c.transport.is_closing()]
            if not idle:
                return False
            oldest = min(idle, key=lambda c: c.idle_since)
            oldest.transport.close()
            return True

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
        self.engine = engine
        self.app = create_app(engine, config)
        self._sock = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((config.host, config.port))
        self.port = self._sock.getsockname()[1]        # the real port when 0 (ephemeral) was asked
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="off",
                                                     timeout_graceful_shutdown=5, http=guarded_protocol(config),
                                                     timeout_keep_alive=5,   # the cap: above, and `AdmissionMiddleware`
                                                     h11_max_incomplete_event_size=MAX_HEAD_BYTES))
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
        self.engine.unsubscribe(self.app.state.metrics.on_event)     # a restarted endpoint counts afresh

    def __enter__(self) -> EndpointServer:
        self.start()
        self.wait_started()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(engine: Engine, config: ServerConfig, lifetime_s: float | None = None) -> int:
    """Serve until SIGTERM, SIGINT or SIGHUP, or for `lifetime_s`, then close the engine (every open
    conversation's KV file is written) with the signals still handled; 0 on a clean stop, 2 when the address
    cannot be served or the model fails to load. The port opens while the model loads (`/health` says 503 until it
    is ready; requests wait behind the load), as llama-server does."""
    try:
        server = EndpointServer(engine, config)
    except (ValueError, OSError) as exc:
        log.error("cannot serve: %s", exc)
        return 2
    if server.warning:
        print(server.warning, file=sys.stderr)
    stop_requested = threading.Event()
    loaded = threading.Event()
    engine.ready.add_done_callback(lambda _future: loaded.set())
    with shutdown_signals(lambda _signum: stop_requested.set()) as received:
        server.start()
        if not server.wait_started():
            server.stop()
            log.error("the endpoint on %s did not start", server.address)
            return 2
        started = time.monotonic()

        def load_failed(exc: BaseException) -> int:
            server.stop()
            log.error("the model failed to load: %s", exc)
            return 2
        if loaded.is_set() and engine.ready.exception() is not None:     # a missing file: said before any address
            return load_failed(engine.ready.exception())
        key_note = "an API key is required" if config.api_key else "no API key"
        loading = "" if loaded.is_set() else "; the model is loading, /health answers 503 until it is ready"
        print(f"Evoke Desk endpoint on {server.address} ({key_note}){loading}; Ctrl-C stops it", flush=True)
        failure = _wait_loaded(engine, loaded, stop_requested, lifetime_s)
        if failure is not None:
            return load_failed(failure)
        left = None if lifetime_s is None else max(0.0, lifetime_s - (time.monotonic() - started))
        stop_requested.wait(left)
        why = signal_name(received[0]) if received else "lifetime over" if lifetime_s else "stopped"
        print(f"stopping the endpoint ({why})", flush=True)
        server.stop()
        engine.close()                # a second signal now changes nothing: the handlers are still ours
    log.info("endpoint stopped (%s)", why)
    print("endpoint stopped", flush=True)
    return 0


def _wait_loaded(engine: Engine, loaded: threading.Event, stop_requested: threading.Event,
                 lifetime_s: float | None) -> BaseException | None:
    """Wait for the model's load (or a stop, or the lifetime's end); the load's exception when it failed, after
    saying on stdout that the model is ready when it did not."""
    deadline = None if lifetime_s is None else time.monotonic() + lifetime_s
    while not loaded.wait(0.1):
        if stop_requested.is_set() or (deadline is not None and time.monotonic() >= deadline):
            return None
    failure = engine.ready.exception()
    if failure is None:
        info = engine.model_info()
        print(f"model ready: {info.name} on {info.device}", flush=True)
    return failure
