"""The engine thread: one thread runs every job that touches llama.cpp, in priority order.

Invariants: jobs run one at a time, lower priority value first, FIFO within a priority; a job
submitted after `stop` fails its future instead of being lost silently.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

FOREGROUND, NORMAL, BACKGROUND = 0, 10, 20


class EngineThread:
    def __init__(self, name: str = "evoke-engine") -> None:
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()
        self._stopped = False
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any, priority: int = NORMAL, **kwargs: Any) -> Future:
        future: Future = Future()
        if self._stopped:
            future.set_exception(RuntimeError("the engine is closed"))
            return future
        self._queue.put((priority, next(self._order), fn, args, kwargs, future))
        return future

    def call(self, fn: Callable[..., Any], *args: Any, priority: int = NORMAL, **kwargs: Any) -> Any:
        """Run `fn` on the engine thread and wait (runs inline when already on it)."""
        if threading.current_thread() is self.thread:
            return fn(*args, **kwargs)
        return self.submit(fn, *args, priority=priority, **kwargs).result()

    def pending(self) -> int:
        """Jobs queued and not yet started (approximate while other threads submit)."""
        return self._queue.qsize()

    def _run(self) -> None:
        while True:
            _, _, fn, args, kwargs, future = self._queue.get()
            if fn is None:
                break
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)

    def stop(self, timeout: float | None = 30) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._queue.put((10**9, next(self._order), None, (), {}, None))
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout)
