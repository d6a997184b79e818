"""The signals that ask a process to shut down cleanly (SIGTERM from a service manager or `kill`, SIGINT from
Ctrl-C, SIGHUP when the terminal or session goes away), turned into a call instead of an exception or a death.

Invariants: handlers are installed only on the main thread (elsewhere `shutdown_signals` installs nothing and says
so in the log); the previous handlers come back when the block ends; a handler only records the signal and calls
the callback, which must be safe to run between any two bytecodes (set an Event, quit a loop).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)
SHUTDOWN_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))


@contextlib.contextmanager
def shutdown_signals(callback: Callable[[int], None]) -> Iterator[list[int]]:
    """While the block runs, each shutdown signal calls `callback(signum)`; yields the signals received so far."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        log.debug("shutdown signals are handled on the main thread only; none installed here")
        yield received
        return

    def handler(signum: int, _frame) -> None:
        received.append(signum)
        callback(signum)

    previous = {sig: signal.signal(sig, handler) for sig in SHUTDOWN_SIGNALS}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
