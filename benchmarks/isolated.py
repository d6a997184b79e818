"""A bench system in a process of its own, as llama-server runs and as the app runs Evoke: llama.cpp
decodes in one process slow down when other models decode in the same process between their turns.

Invariants: the child builds the system from a picklable factory and answers one call at a time, in
order; timings are measured inside the child, where the system runs; an error in the child is raised
in the parent with the child's traceback; closing runs the system's own close there and ends the child
(a daemon: the parent's exit ends it too).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import traceback
from typing import Any


class IsolatedSystem:
    """`factory(*args, **kwargs)` built and called in a spawned process; `call("ask", ...)` returns its result."""

    def __init__(self, factory, *args, **kwargs) -> None:
        spawn = multiprocessing.get_context("spawn")     # no fork: the parent's threads and models stay behind
        self._conn, child_end = spawn.Pipe()
        self._process = spawn.Process(target=_serve, args=(child_end, factory, args, kwargs), daemon=True,
                                      name=f"bench-{getattr(factory, '__name__', 'system')}")
        self._process.start()
        child_end.close()
        self._reply()                                    # built, or the child's error

    def call(self, method: str, *args) -> Any:
        self._conn.send((method, args))
        return self._reply()

    def ask(self, name: str, message: str) -> float:
        return self.call("ask", name, message)

    def close(self) -> None:
        """The system's own `close` (if it has one) runs in the child, which then exits."""
        if self._process.is_alive():
            with contextlib.suppress(OSError):
                self._conn.send(None)
            self._process.join(timeout=60)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()

    def _reply(self) -> Any:
        try:
            ok, value = self._conn.recv()
        except EOFError:
            raise RuntimeError(f"{self._process.name} exited (code {self._process.exitcode})") from None
        if not ok:
            raise RuntimeError(f"{self._process.name} failed:\n{value}")
        return value


def _serve(conn, factory, args, kwargs) -> None:
    try:
        system = factory(*args, **kwargs)
    except BaseException:           # noqa: BLE001 - reported to the parent, which raises it
        conn.send((False, traceback.format_exc()))
        return
    conn.send((True, None))
    while (request := conn.recv()) is not None:
        method, call_args = request
        try:
            conn.send((True, getattr(system, method)(*call_args)))
        except BaseException:       # noqa: BLE001
            conn.send((False, traceback.format_exc()))
    if callable(getattr(system, "close", None)):
        system.close()
