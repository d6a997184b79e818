"""Every decode of the process runs on one OS thread, whichever thread asks: llama.cpp's CPU backend computes in an
OpenMP team owned by the calling thread, and libgomp stops spinning at the graph's barriers once its teams' threads
outnumber the cores (a token 3-4x slower on two cores). The engine's replies decode on threads of their own, so the
runtime hands each decode to its compute thread; callers that come and go then own no team."""

from __future__ import annotations

import os
import threading

import pytest

from evoke_engine.runtime.runtime import Runtime
from evoke_engine.settings import Settings


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.fixture(scope="module")
def rt(tmp_path_factory):
    runtime = Runtime(Settings(n_ctx=512, slots=1, n_threads=2, slot_layout="unified",
                               home=str(tmp_path_factory.mktemp("compute"))))
    yield runtime
    runtime.close()


def test_decodes_from_threads_that_come_and_go_start_no_thread_of_their_own(rt):
    tokens = rt.tokenize("The river runs past the mill and the")
    rt.holds_engine = lambda: True                      # the callers below take turns, as replies do
    rt.decode(tokens, 0, 0)                              # the compute thread and its team exist from here
    before = _threads()
    decoded, release = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def caller(pos: int) -> None:
        try:
            rt.decode([tokens[-1]], 0, pos)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
        decoded.set()
        release.wait(30)

    callers = []
    for k in range(3):                                   # one after another, each alive past its decode
        decoded.clear()
        callers.append(threading.Thread(target=caller, args=(len(tokens) + k,)))
        callers[-1].start()
        assert decoded.wait(30)
    try:
        assert not failures
        # each caller is one thread; a caller that decoded itself would also own an OpenMP worker (n_threads 2)
        assert _threads() == before + len(callers)
    finally:
        release.set()
        for thread in callers:
            thread.join()
