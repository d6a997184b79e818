"""The one bridge between Qt and the engine: owns the Engine and the threads that call it.

Invariants: no engine method runs on the GUI thread (asserted in `_run`); every result, error,
token and engine event reaches Qt as a queued signal delivered on the GUI thread.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal

from .qt_scheduler import QtEventLoopScheduler

log = logging.getLogger(__name__)


def error_text(exc: BaseException) -> str:
    """A message a user can read: the engine's own errors verbatim, others with their type."""
    try:
        from evoke_engine.errors import EvokeError
    except ImportError:  # pragma: no cover - engine missing entirely
        EvokeError = ()  # type: ignore[assignment] # noqa: N806
    if isinstance(exc, EvokeError | OSError | ValueError):
        return str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {exc}"


class EngineBridge(QObject):
    """Creates the Engine off the GUI thread and relays its results and callbacks as signals."""

    modelLoading = Signal()
    modelReady = Signal(object)          # ModelInfo
    modelFailed = Signal(str)
    engineEvent = Signal(object)         # EngineEvent
    token = Signal(str, str)             # conversation id, text piece
    error = Signal(str)                  # an unhandled failure of a call
    closing = Signal()                   # close() began: stop timers, expect no more results
    _deliver = Signal(object, object)    # callback, argument (runs on the GUI thread)

    def __init__(self, settings, *, engine_factory: Callable[..., Any] | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        self.engine: Any = None
        self.gui_thread = threading.current_thread()
        self._factory = engine_factory
        self._calls = ThreadPoolExecutor(1, thread_name_prefix="evoke-app-calls")
        self._urgent = ThreadPoolExecutor(1, thread_name_prefix="evoke-app-urgent")
        self._deliver.connect(self._on_deliver, Qt.ConnectionType.QueuedConnection)
        self.scheduler = QtEventLoopScheduler()
        self.scheduler_attached = False
        self.load_error: BaseException | None = None
        self._closed = False

    # -- calls ------------------------------------------------------------------------------
    def call(self, fn: Callable[..., Any], *args: Any, on_done: Callable[[Any], None] | None = None,
             on_error: Callable[[BaseException], None] | None = None, urgent: bool = False,
             **kwargs: Any) -> Future:
        """Run fn(*args, **kwargs) on the call thread; on_done/on_error run on the GUI thread.

        After `close` nothing runs: the returned future is already cancelled.
        """
        if self._closed:
            future: Future = Future()
            future.cancel()
            return future
        pool = self._urgent if urgent else self._calls
        future = pool.submit(self._run, fn, args, kwargs)
        self.track(future, on_done=on_done, on_error=on_error)
        return future

    def track(self, future: Future, *, on_done: Callable[[Any], None] | None = None,
              on_error: Callable[[BaseException], None] | None = None) -> None:
        """Deliver an engine Future's outcome on the GUI thread."""
        future.add_done_callback(lambda f: self._settle(f, on_done, on_error))

    def _run(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        assert threading.current_thread() is not self.gui_thread, "engine call on the GUI thread"
        return fn(*args, **kwargs)

    def _settle(self, future: Future, on_done, on_error) -> None:
        try:
            result, exc = future.result(), None
        except CancelledError as cancelled:
            result, exc = None, cancelled
        except BaseException as failure:  # noqa: BLE001 - every failure reaches the user
            result, exc = None, failure
        if exc is None:
            if on_done is not None:
                self._deliver.emit(on_done, result)
        else:
            log.debug("engine call failed", exc_info=exc)
            self._deliver.emit(on_error or self._unhandled, exc)

    def _on_deliver(self, callback: Callable[[Any], None], argument: Any) -> None:
        if not self._closed:
            callback(argument)

    def _unhandled(self, exc: BaseException) -> None:
        log.error("engine call failed: %s", error_text(exc), exc_info=exc)
        self.error.emit(error_text(exc))

    # -- engine lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        """Create the engine on the call thread; modelReady or modelFailed follows."""
        self.modelLoading.emit()
        self.call(self._create, on_done=self._created, on_error=self._load_failed)

    def _create(self) -> Any:
        factory = self._factory
        if factory is None:
            from evoke_engine import Engine
            factory = Engine
        kwargs: dict[str, Any] = {"wait": False}
        try:
            params = inspect.signature(factory).parameters
        except (TypeError, ValueError):
            params = {}
        if "scheduler" in params:
            kwargs["scheduler"] = self.scheduler
            self.scheduler_attached = True
        else:  # HOOK: the engine does not take scheduler= yet; its sweeps run on its own timer
            log.warning("Engine() takes no scheduler=; the scheduler does not run in the Qt loop")
        engine = factory(self.settings, **kwargs)   # frozen: the engine and the window share the value
        engine.subscribe(self._on_engine_event)
        return engine

    def restart(self, settings) -> None:
        """Replace an engine whose model never loaded by a new one on `settings` (off the GUI thread)."""
        old, self.engine = self.engine, None
        self.settings = settings
        self.scheduler = QtEventLoopScheduler()          # the old engine shuts its scheduler down
        self.scheduler_attached = False
        self.modelLoading.emit()

        def work() -> Any:
            if old is not None:
                old.close()
            return self._create()
        self.call(work, on_done=self._created, on_error=self._load_failed)

    def _created(self, engine: Any) -> None:
        self.engine = engine
        self.track(engine.ready, on_done=lambda _: self._loaded(), on_error=self._load_failed)

    def _loaded(self) -> None:
        self.call(lambda: self.engine.model_info(), on_done=self.modelReady.emit,
                  on_error=self._load_failed)

    def _load_failed(self, exc: BaseException) -> None:
        log.error("the model did not load: %s", error_text(exc))     # stderr and the log file (Help → About)
        self.load_error = exc                  # the controller tells a busy data folder from a bad model
        self.modelFailed.emit(error_text(exc))

    def _on_engine_event(self, event: Any) -> None:   # engine thread
        if not self._closed:
            self.engineEvent.emit(event)

    def token_callback(self, conversation_id: str) -> Callable[..., None]:
        """An on_token callback for the engine thread that streams into `token`."""
        def on_token(piece: Any, *_: Any) -> None:
            self.token.emit(conversation_id, piece if isinstance(piece, str) else str(piece))
        return on_token

    def close(self, timeout: float = 120.0) -> None:
        """Persist and stop the engine (blocks: call after the window is gone)."""
        if self._closed:
            return
        self._closed = True
        self.closing.emit()
        engine = self.engine
        if engine is not None:
            try:
                self._calls.submit(engine.close).result(timeout=timeout)
            except Exception:  # noqa: BLE001 - closing must not raise at exit
                log.exception("engine close failed")
        self._calls.shutdown(wait=False)
        self._urgent.shutdown(wait=False)
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
