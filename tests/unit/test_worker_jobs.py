"""The engine thread's typed jobs (issue 47): every job has an id, a command and the conversation it is about;
`jobs()` lists the running one then the queued ones in run order; `cancel(id)` drops a queued job or tells a running
one through its hook; the future carries its job."""

from __future__ import annotations

import threading

import pytest

from evoke_engine.worker import BACKGROUND, FOREGROUND, Command, EngineThread


@pytest.fixture
def thread():
    worker = EngineThread("jobs-test")
    yield worker
    worker.stop()


def test_jobs_are_listed_running_first_then_in_run_order(thread):
    gate, started = threading.Event(), threading.Event()
    blocker = thread.submit(lambda: (started.set(), gate.wait(5)), command=Command.TURN, about="conv-a")
    started.wait(5)
    sweep = thread.submit(lambda: "swept", priority=BACKGROUND, command=Command.SWEEP)
    opened = thread.submit(lambda: "opened", priority=FOREGROUND, command=Command.OPEN, about="conv-b")
    listed = thread.jobs()
    assert [j.command for j in listed] == [Command.TURN, Command.OPEN, Command.SWEEP]
    assert listed[0] is blocker.job and listed[0].conversation_id == "conv-a"
    assert blocker.job.id < sweep.job.id < opened.job.id
    gate.set()
    assert opened.result(5) == "opened" and sweep.result(5) == "swept"
    assert thread.jobs() == []


def test_cancel_drops_a_queued_job_and_tells_a_running_one(thread):
    gate, started, told = threading.Event(), threading.Event(), threading.Event()

    def turn():
        started.set()
        told.wait(5)
        return "stopped" if told.is_set() else "ran on"
    running = thread.submit(turn, command=Command.TURN, about="c", on_cancel=told.set)
    started.wait(5)
    queued = thread.submit(gate.wait, 5, command=Command.COMPLETE)
    assert thread.cancel(queued.job.id) and queued.cancelled()
    assert thread.cancel(running.job.id) and running.result(5) == "stopped"
    assert not thread.cancel(running.job.id) and not thread.cancel(10**6)        # done, or never was


def test_a_failing_job_leaves_the_list_and_hands_its_error_over(thread):
    failing = thread.submit(lambda: 1 / 0, command=Command.READ)
    with pytest.raises(ZeroDivisionError):
        failing.result(5)
    assert thread.jobs() == [] and failing.job.command is Command.READ
