"""The one OS thread that runs every `llama_decode` of the process, whichever thread asks (the engine's scheduler,
a reply's stream thread, a test's, a comparator's).

Invariants: llama.cpp's CPU backend computes a graph in an OpenMP team owned by the calling thread, and libgomp
stops spinning at its barriers (each of a graph's hundreds of barriers becomes a futex sleep and wake) as soon as
the threads of every team it manages outnumber the cores: with the engine thread and a reply's stream thread each
owning a team of two on two cores, a token took 35 ms instead of 9 (measured: `python -m benchmarks decode`,
docs/benchmarks.md). One calling thread keeps one team, so the spinning stays. A caller waits for its own decode;
callers are served one at a time; a decode on this thread itself runs inline.
"""

from __future__ import annotations

import threading

import llama_cpp as ll


class ComputeThread:
    """Runs `llama_decode(ctx, batch)` on its own daemon thread for any caller, and hands back the return code."""

    def __init__(self, name: str = "evoke-compute") -> None:
        self._callers = threading.Lock()          # one decode at a time: the request slots below are single
        self._go = threading.Semaphore(0)
        self._done = threading.Semaphore(0)
        self._request: tuple[object, object] | None = None
        self._rc = 0
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def decode(self, ctx, batch) -> int:
        if threading.current_thread() is self._thread:
            return ll.llama_decode(ctx, batch)
        with self._callers:
            self._request = (ctx, batch)
            self._go.release()
            self._done.acquire()
            failure, self._failure = self._failure, None
            if failure is not None:
                raise failure
            return self._rc

    def _serve(self) -> None:
        while True:
            self._go.acquire()
            assert self._request is not None
            ctx, batch = self._request
            self._request = None
            try:
                self._rc = ll.llama_decode(ctx, batch)
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
                self._failure = exc
            self._done.release()


_shared: ComputeThread | None = None
_shared_lock = threading.Lock()


def llama_decode(ctx, batch) -> int:
    """`llama_cpp.llama_decode`, run on the process's compute thread (started on first use)."""
    global _shared
    if _shared is None:
        with _shared_lock:
            if _shared is None:
                _shared = ComputeThread()
    return _shared.decode(ctx, batch)
