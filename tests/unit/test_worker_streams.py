"""Replies as streams on the engine thread (issue 59): two replies take turns a step at a time; a job about a
streaming conversation waits for its reply to end; LOAD and SWEEP wait until no reply streams; at most
`stream_limit()` replies stream at once; only one thread holds the engine at any moment; a stream's failure and
cancel reach its caller; stop lets every stream finish."""

from __future__ import annotations

import threading
import time

import pytest

from evoke_engine.worker import FOREGROUND, LATENCY, NORMAL, PREFILL_COST, Command, EngineThread


class StepClock:
    """Engine time as the test decides it: each step of a `Reply` costs its `cost` (no sleeping, no load noise)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Reply:
    """A stand-in reply: `steps` steps, each recorded as (name, step) with a step boundary before it (a token's, or
    with `prefill` a prefill chunk's: no first token yet, so its start credit applies); it checks that no other
    thread holds the engine while it runs."""

    def __init__(self, engine: EngineThread, log: list, holders: list, name: str, steps: int,
                 cancel: threading.Event | None = None, step_s: float = 0.0, cost: float = 0.0,
                 clock: StepClock | None = None, prefill: bool = False) -> None:
        self.boundary = engine.step_boundary if prefill else engine.token_boundary
        self.engine, self.log, self.holders, self.name, self.steps = engine, log, holders, name, steps
        self.cancel = cancel or threading.Event()
        self.step_s = step_s                            # how long a step holds the engine (a decode's stand-in)
        self.cost, self.clock = cost, clock             # or what it costs on the engine's clock

    def __call__(self) -> str:
        for step in range(self.steps):
            self.boundary()
            if self.cancel.is_set():
                return f"{self.name} stopped at {step}"
            self.holders.append(self.name)
            assert len(self.holders) == 1, self.holders             # nobody else is inside a step
            assert self.engine.on_engine()
            self.log.append((self.name, step))
            time.sleep(self.step_s)
            if self.clock is not None:
                self.clock.now += self.cost
            self.holders.pop()
        return f"{self.name} done"


@pytest.fixture
def engine():
    worker = EngineThread("streams-test", stream_limit=lambda: 3)
    yield worker
    worker.stop()


def hold(engine: EngineThread) -> threading.Event:
    """Occupy the engine with a plain job until the returned event is set (so submissions queue up together)."""
    gate, started = threading.Event(), threading.Event()
    engine.submit(lambda: (started.set(), gate.wait(10)), command=Command.READ)
    started.wait(10)
    return gate


@pytest.fixture
def timed():
    """An engine whose streams' time is a `StepClock`'s."""
    clock = StepClock()
    worker = EngineThread("timed-test", stream_limit=lambda: 3, clock=clock)
    yield worker, clock
    worker.stop()


def test_two_replies_take_turns_a_step_at_a_time(timed):
    engine, clock = timed
    log, holders = [], []
    gate = hold(engine)
    a = engine.submit(Reply(engine, log, holders, "a", 10, cost=0.01, clock=clock), command=Command.TURN,
                      about="conv-a")
    b = engine.submit(Reply(engine, log, holders, "b", 10, cost=0.01, clock=clock), command=Command.TURN,
                      about="conv-b")
    gate.set()
    assert a.result(10) == "a done" and b.result(10) == "b done"
    assert [name for name, _ in log] == ["b", "a"] * 10                     # a step each, in turn, the newest first
    assert [s for n, s in log if n == "a"] == list(range(10))                 # each in its own order


def test_a_decoding_reply_is_not_starved_by_a_long_prefills_steps(timed):
    engine, clock = timed
    log, holders = [], []
    gate = hold(engine)
    prefill = engine.submit(Reply(engine, log, holders, "p", 8, cost=0.08, clock=clock, prefill=True),
                            command=Command.TURN, about="p")
    decode = engine.submit(Reply(engine, log, holders, "d", 200, cost=0.004, clock=clock), command=Command.TURN,
                           about="d")
    gate.set()
    prefill.result(20), decode.result(20)
    names = "".join(n for n, _ in log)
    between = [len(run) for run in names.strip("d").split("p")[1:-1]]      # decode steps between prefill steps
    credit = sum(1 for n in between if n == 1)                             # its start credit (0.3 s): a step in
    assert credit == 3 and between[:credit] == [1] * credit                 # turn, then the part-charged step
    share = round(0.08 * PREFILL_COST / 0.004)              # then a prefill step's time (counted PREFILL_COST times)
    assert between[credit + 1:] and all(share - 1 <= n <= share + 1 for n in between[credit + 1:])


def test_a_job_about_a_streaming_conversation_waits_for_its_reply(engine):
    log, holders = [], []
    gate = hold(engine)
    reply = engine.submit(Reply(engine, log, holders, "a", 4), command=Command.TURN, about="conv-a")
    edit = engine.submit(lambda: log.append(("edit", 0)), command=Command.EDIT, about="conv-a")
    other = engine.submit(lambda: log.append(("other", 0)), command=Command.READ, about="conv-b")
    gate.set()
    reply.result(10), edit.result(10), other.result(10)
    names = [n for n, _ in log]
    assert names == ["other", "a", "a", "a", "a", "edit"]    # another conversation's job while the reply streams
                                                             # (started, before its first token); the edit of the
                                                             # streaming one only after its reply


def test_load_and_sweep_wait_until_no_reply_streams(engine):
    log, holders = [], []
    gate = hold(engine)
    reply = engine.submit(Reply(engine, log, holders, "a", 4), command=Command.TURN, about="conv-a")
    load = engine.submit(lambda: log.append(("load", 0)), command=Command.LOAD)
    sweep = engine.submit(lambda: log.append(("sweep", 0)), command=Command.SWEEP)
    gate.set()
    reply.result(10), load.result(10), sweep.result(10)
    assert [n for n, _ in log] == ["a"] * 4 + ["load", "sweep"]


def test_replies_past_the_limit_wait_in_order():
    engine = EngineThread("limit-test", stream_limit=lambda: 1)
    try:
        log, holders = [], []
        gate = hold(engine)
        futures = [engine.submit(Reply(engine, log, holders, name, 3), command=Command.TURN, about=name)
                   for name in ("a", "b", "c")]
        gate.set()
        assert [f.result(10) for f in futures] == ["a done", "b done", "c done"]
        assert [n for n, _ in log] == ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    finally:
        engine.stop()


def test_reply_counts_and_queue_positions_say_how_many_stream_and_wait():
    engine = EngineThread("counts-test", stream_limit=lambda: 1)
    try:
        gate, started = threading.Event(), threading.Event()
        first = engine.submit(lambda: (started.set(), gate.wait(10)), command=Command.TURN, about="a")
        started.wait(10)
        second = engine.submit(lambda: None, command=Command.TURN, about="b")
        window = engine.submit(lambda: None, command=Command.TURN, about="c", priority=FOREGROUND)
        assert engine.reply_counts() == (1, 2)
        assert [engine.queue_position(f.job.id) for f in (first, second, window)] == [0, 2, 1]  # the window's first
        gate.set()
        first.result(10), second.result(10), window.result(10)
        assert engine.reply_counts() == (0, 0) and engine.queue_position(second.job.id) is None
    finally:
        engine.stop()


def test_the_window_reply_is_admitted_before_earlier_endpoint_replies():
    engine = EngineThread("priority-test", stream_limit=lambda: 1)
    try:
        log, holders = [], []
        gate = hold(engine)
        endpoint = engine.submit(Reply(engine, log, holders, "endpoint", 2), priority=NORMAL, command=Command.TURN,
                                 about="e")
        window = engine.submit(Reply(engine, log, holders, "window", 2), priority=FOREGROUND, command=Command.TURN,
                               about="w")
        gate.set()
        endpoint.result(10), window.result(10)
        assert [n for n, _ in log] == ["window", "window", "endpoint", "endpoint"]
    finally:
        engine.stop()


def test_a_raw_completion_streams_past_the_reply_limit_one_at_a_time():
    """Completions are short and latency-bound: one streams beside replies that fill `stream_limit` (its steps take
    turns with theirs), a second waits for the first, and a queued completion starts before queued endpoint
    replies."""
    clock = StepClock()
    engine = EngineThread("completion-test", stream_limit=lambda: 1, clock=clock)
    try:
        log, holders = [], []

        def step(name: str, steps: int) -> Reply:
            return Reply(engine, log, holders, name, steps, cost=1.0, clock=clock)
        gate = hold(engine)
        reply = engine.submit(step("reply", 6), priority=NORMAL, command=Command.TURN, about="r")
        later = engine.submit(step("later", 1), priority=NORMAL, command=Command.TURN, about="l")
        first = engine.submit(step("fim1", 2), priority=LATENCY, command=Command.COMPLETE)
        second = engine.submit(step("fim2", 2), priority=LATENCY, command=Command.COMPLETE)
        assert engine.queue_position(first.job.id) == 1 and engine.queue_position(later.job.id) == 4
        gate.set()
        for future in (reply, later, first, second):
            future.result(10)
        names = [n for n, _ in log]
        last_reply = max(i for i, n in enumerate(names) if n == "reply")
        assert max(i for i, n in enumerate(names) if n == "fim1") < last_reply  # beside the reply, past the limit
        assert names.index("fim2") > max(i for i, n in enumerate(names) if n == "fim1")    # one at a time
        assert names.index("fim2") < last_reply and names.index("later") > last_reply
    finally:
        engine.stop()


def test_the_window_reply_preempts_an_endpoint_reply_past_the_limit():
    """At the reply limit, the window's reply does not wait for an endpoint reply to end: the newest endpoint reply is
    suspended (no step while the window's streams), then goes on where it stopped, and the others keep theirs."""
    engine = EngineThread("preempt-test", stream_limit=lambda: 2)
    try:
        log, holders = [], []
        gate = hold(engine)
        old = engine.submit(Reply(engine, log, holders, "old", 12), priority=NORMAL, command=Command.TURN, about="o")
        new = engine.submit(Reply(engine, log, holders, "new", 12), priority=NORMAL, command=Command.TURN, about="n")
        gate.set()
        while len(log) < 4:
            time.sleep(0.001)
        window = engine.submit(Reply(engine, log, holders, "window", 4), priority=FOREGROUND,
                               command=Command.TURN, about="w")
        assert window.result(10) == "window done"
        assert old.result(10) == "old done" and new.result(10) == "new done"
        names = [n for n, _ in log]
        first, last = names.index("window"), len(names) - 1 - names[::-1].index("window")
        during = names[first:last + 1]
        assert "new" not in during                                      # the newest endpoint reply paused
        assert [s for n, s in log if n == "new"] == list(range(12))     # and went on where it stopped
        assert engine.suspended() == []
    finally:
        engine.stop()


def test_plain_jobs_run_between_a_replys_steps(engine):
    log, holders = [], []
    gate = hold(engine)
    reply = engine.submit(Reply(engine, log, holders, "a", 200, step_s=0.002), command=Command.TURN, about="conv-a")
    gate.set()
    while not log:
        threading.Event().wait(0.001)
    stats = engine.submit(lambda: log.append(("stats", 0)) or "read", priority=FOREGROUND, command=Command.READ)
    assert stats.result(10) == "read"                 # answered while the reply goes on
    reply.result(10)
    names = [n for n, _ in log]
    assert 0 < names.index("stats") < len(names) - 1                 # between two of the reply's steps


def test_a_stream_is_cancelled_at_its_next_step_and_a_failure_reaches_its_caller(engine):
    log, holders = [], []
    told = threading.Event()
    gate = hold(engine)
    reply = engine.submit(Reply(engine, log, holders, "a", 5000, told, step_s=0.002), command=Command.TURN,
                          about="conv-a", on_cancel=told.set)
    failing = engine.submit(lambda: 1 / 0, command=Command.TURN, about="conv-b")
    gate.set()
    with pytest.raises(ZeroDivisionError):
        failing.result(10)
    while not log:
        threading.Event().wait(0.001)
    assert engine.cancel(reply.job.id)
    assert reply.result(10).startswith("a stopped at")
    assert engine.jobs() == [] and engine.streaming() == []


def test_stop_lets_every_stream_finish():
    engine = EngineThread("stop-test", stream_limit=lambda: 2)
    log, holders = [], []
    gate = hold(engine)
    futures = [engine.submit(Reply(engine, log, holders, name, 20), command=Command.TURN, about=name)
               for name in ("a", "b")]
    gate.set()
    engine.stop(10)
    assert [f.result(0) for f in futures] == ["a done", "b done"]
    assert not engine.thread.is_alive()
    late = engine.submit(lambda: None)
    with pytest.raises(RuntimeError, match="closed"):
        late.result(1)


def test_step_boundary_outside_a_stream_is_a_no_op(engine):
    engine.step_boundary()                             # a test's own thread: nothing happens
    assert engine.submit(lambda: engine.step_boundary() or "plain", command=Command.READ).result(10) == "plain"


def test_work_about_another_conversation_splits_a_lone_reply_for_a_moment(timed):
    """A request's next job comes a few milliseconds after its first ends: for `ARRIVAL_GRACE_S` after work about
    another conversation arrived, a lone reply counts as contended (its prefill runs in steps); its own turn, reads
    and idle embedding do not count."""
    from evoke_engine.worker import ARRIVAL_GRACE_S
    engine, clock = timed
    seen: list[tuple[str, bool]] = []
    stages = ("own", "read", "embed", "other", "later")
    go = {stage: threading.Event() for stage in stages}

    def reply() -> None:
        for stage in stages:
            go[stage].wait(10)
            engine.step_boundary()                  # the jobs queued meanwhile run here
            seen.append((stage, engine.contended()))

    def at(stage: str, job: Command | None = None) -> None:        # one job a step: one runs at each boundary
        done = engine.submit(lambda: None, command=job, about="conv-b") if job is not None else None
        go[stage].set()
        if done is not None:
            done.result(10)
        while len(seen) < stages.index(stage) + 1:
            time.sleep(0.001)
    stream = engine.submit(reply, command=Command.TURN, about="conv-a")
    at("own")
    at("read", Command.READ)
    at("embed", Command.EMBED)
    at("other", Command.OPEN)
    clock.now += ARRIVAL_GRACE_S + 0.1
    at("later")
    stream.result(10)
    assert seen == [("own", False), ("read", False), ("embed", False), ("other", True), ("later", False)]


def test_a_prefill_step_beside_decoding_replies_takes_about_one_and_a_half_of_their_token_steps(engine):
    """Sized from the runtime's measures (a 10 ms token step, 5 ms a prompt token: 3 tokens) for a stream submitted
    after a decoding reply's first token; the cap until both are measured, where no other reply decodes, for a stream
    sent together with the decoding one (before its first token: requests sent together start together), and for a
    stream that goes before every other streaming one (the window's turn beside endpoint replies)."""
    assert engine.prefill_tokens_per_step(0.005, 0.01, 32) == 32                 # nothing else streams
    seen: dict[str, object] = {}
    window_first, late_done = threading.Event(), threading.Event()

    def until(done) -> None:
        while not done():
            engine.step_boundary()

    def window() -> str:
        engine.token_boundary()                              # its first token: it decodes from here
        window_first.set()
        until(lambda: "sent after its first token" in seen)
        seen["window"] = engine.prefill_tokens_per_step(0.005, 0.01, 32)
        until(late_done.is_set)
        return "window"

    def sent_together() -> str:
        until(window_first.is_set)
        seen["sent with it"] = engine.prefill_tokens_per_step(0.005, 0.01, 32)
        until(late_done.is_set)
        return "together"

    def sent_late() -> str:
        seen["sent after its first token"] = engine.prefill_tokens_per_step(0.005, 0.01, 32)
        seen["measures"] = (engine.prefill_tokens_per_step(None, 0.01, 32),
                            engine.prefill_tokens_per_step(0.005, None, 32),
                            engine.prefill_tokens_per_step(0.05, 0.01, 32),
                            engine.prefill_tokens_per_step(1e-5, 0.01, 32))
        until(lambda: "window" in seen and "sent with it" in seen)
        late_done.set()
        return "late"
    gate = hold(engine)
    first = engine.submit(window, priority=FOREGROUND, command=Command.TURN, about="window")
    together = engine.submit(sent_together, command=Command.TURN, about="api-1")
    gate.set()
    assert window_first.wait(10)
    late = engine.submit(sent_late, command=Command.TURN, about="api-2")
    assert first.result(10) == "window" and together.result(10) == "together" and late.result(10) == "late"
    assert seen == {"sent with it": 32, "sent after its first token": 3, "window": 32, "measures": (32, 32, 1, 32)}


def test_a_long_prompt_sent_with_a_reply_is_chunked_again_once_its_start_credit_is_spent(timed):
    """Sent before the decoding reply's first token, a prompt prefills at the cap only within its start credit: a long
    paste sent together with other requests cannot hold their replies for its whole prefill."""
    engine, clock = timed
    seen: list[int] = []
    first = threading.Event()

    def reply() -> str:
        engine.token_boundary()
        first.set()
        while len(seen) < 2:
            clock.now += 0.01                                               # a token step
            engine.step_boundary()
        return "reply"

    def paste() -> str:
        while not first.is_set():
            engine.step_boundary()
        seen.append(engine.prefill_tokens_per_step(0.005, 0.01, 32))       # within its credit: the cap
        clock.now += 0.4                                                    # a chunk past its 0.3 s credit
        engine.step_boundary()
        seen.append(engine.prefill_tokens_per_step(0.005, 0.01, 32))       # then beside the reply's cadence
        return "paste"
    gate = hold(engine)
    decoding = engine.submit(reply, command=Command.TURN, about="reply")
    pasted = engine.submit(paste, command=Command.TURN, about="paste")
    gate.set()
    assert decoding.result(10) == "reply" and pasted.result(10) == "paste"
    assert seen == [32, 3]
