"""The step replies share (issue 59): replies decoding tokens park at their next token and one shared step decodes
them all; a reply still prefilling takes one step a round, so neither holds the other; the step's failure reaches
every reply that waited for it. Plain objects: the step is a recorder, not llama.cpp (tests/integration's
test_engine_streams runs it on the model)."""

from __future__ import annotations

import threading
import time

import pytest

from evoke_engine.worker import PREFILL_COST, Command, EngineThread
from unit.test_worker_streams import StepClock, hold


class SharedStep:
    """What `Runtime.run_step` does, recorded: the waiting tokens, decoded together."""

    def __init__(self) -> None:
        self.waiting: list[str] = []
        self.steps: list[list[str]] = []
        self.fail_with: BaseException | None = None
        self.log: list | None = None               # where each step is also noted, in order with other events

    def __call__(self) -> None:
        waiting, self.waiting = self.waiting, []
        if self.log is not None:
            self.log.append(("step", ",".join(sorted(waiting))))
        if self.fail_with is not None:
            raise self.fail_with
        self.steps.append(sorted(waiting))


def decoder(engine: EngineThread, step: SharedStep, log: list, name: str, tokens: int):
    """A reply decoding `tokens` tokens as `Runtime._decode_next_token` does: join the shared step, or decode
    alone after a step boundary."""
    def run() -> str:
        for _ in range(tokens):
            if engine.joins_step():
                step.waiting.append(name)
                engine.await_step()
            else:
                engine.step_boundary()
                log.append(("alone", name))
        return name
    return run


def prefill(engine: EngineThread, log: list, name: str, chunks: int):
    def run() -> str:
        for chunk in range(chunks):
            if chunk:
                engine.step_boundary()
            log.append(("chunk", name))
        return name
    return run


def on_step_clock(name: str, step_s: float) -> tuple[EngineThread, SharedStep, StepClock]:
    """An engine whose time is a `StepClock`'s and whose shared step (a recorder) costs `step_s` on it."""
    clock = StepClock()
    engine = EngineThread(name, stream_limit=lambda: 4, clock=clock)
    step = SharedStep()

    def shared_step() -> None:
        clock.now += step_s
        step()
    engine.shared_step = shared_step
    return engine, step, clock


@pytest.fixture
def shared():
    engine = EngineThread("shared-step-test", stream_limit=lambda: 4)
    step = SharedStep()
    engine.shared_step = step
    yield engine, step
    engine.stop()


def test_decoding_replies_share_one_step_a_token(shared):
    engine, step = shared
    log: list = []
    gate = hold(engine)
    futures = [engine.submit(decoder(engine, step, log, name, 12), command=Command.TURN, about=name)
               for name in "abc"]
    gate.set()
    assert [f.result(10) for f in futures] == ["a", "b", "c"]
    decoded = [name for batch in step.steps for name in batch] + [name for _, name in log]
    assert sorted(decoded) == sorted("abc" * 12)                  # every token decoded once
    assert sum(len(batch) == 3 for batch in step.steps) >= 10     # nearly every step carries all three
    assert len(step.steps) <= 14


def test_a_prefilling_reply_takes_one_chunk_a_round_beside_the_shared_steps(shared):
    engine, step = shared
    log: list = []
    gate = hold(engine)
    a = engine.submit(decoder(engine, step, log, "a", 30), command=Command.TURN, about="a")
    b = engine.submit(decoder(engine, step, log, "b", 30), command=Command.TURN, about="b")
    p = engine.submit(prefill(engine, log, "p", 10), command=Command.TURN, about="p")
    step.log = log
    gate.set()
    a.result(10), b.result(10), p.result(10)
    events = [kind for kind, _ in log if kind in ("step", "chunk")]
    first, last = events.index("chunk"), len(events) - 1 - events[::-1].index("chunk")
    between = "".join("s" if kind == "step" else "c" for kind in events[first:last + 1]).split("c")[1:-1]
    assert between and all(run == "s" for run in between)        # one shared step between two chunks: no stall


def test_a_costly_prefill_chunk_buys_the_parked_replies_their_share_of_steps():
    """A long paste's chunks cost several of a streaming reply's tokens: once the paste's start credit is spent, it
    takes a chunk only when the parked replies have had as much engine time each as the chunk counts against it (a
    0.04 s step shared by two, a 0.2 s chunk counted `PREFILL_COST` times: twenty steps a chunk), not one chunk a
    token."""
    engine, step, clock = on_step_clock("share-test", step_s=0.04)
    log: list = []

    def costly_prefill() -> str:
        for chunk in range(12):
            if chunk:
                engine.step_boundary()
            clock.now += 0.2
            log.append(("chunk", "p"))
        return "p"
    step.log = log
    try:
        gate = hold(engine)
        streamer = engine.submit(decoder(engine, step, log, "a", 200), command=Command.TURN, about="a")
        other = engine.submit(decoder(engine, step, log, "b", 200), command=Command.TURN, about="b")
        paste = engine.submit(costly_prefill, command=Command.TURN, about="p")
        gate.set()
        paste.result(10), streamer.result(10), other.result(10)
    finally:
        engine.stop()
    events = "".join("s" if kind == "step" else "c" for kind, _ in log if kind in ("step", "chunk"))
    runs = [len(run) for run in events[events.index("c"):events.rindex("c") + 1].split("c")[1:-1]]
    assert runs[0] == 1                                                   # in its start credit: a step in turn
    share = round(0.2 * PREFILL_COST / 0.02)                             # then their share of each chunk's time
    assert runs[-4:] and all(share - 1 <= n <= share + 1 for n in runs[-4:])


def test_a_newcomers_uncharged_start_is_no_claim_on_the_reply_it_cut_in_beside():
    """A reply arriving beside a decoding one prefills in turn with the shared steps, uncharged (its start credit);
    once its first token is out both ride every shared step: the older is not left out while the newcomer's
    charged engine time catches up with the steps the older was charged meanwhile."""
    engine, step, clock = on_step_clock("newcomer-test", step_s=0.013)
    log: list = []

    def newcomer() -> str:
        for chunk in range(8):                       # its prompt, a chunk a step: 0.16 s, inside its start credit
            if chunk:
                engine.step_boundary()
            clock.now += 0.02
        return decoder(engine, step, log, "b", 20)()
    newcomer_done = threading.Event()

    def older() -> str:                              # decodes until the newcomer has ended
        while not newcomer_done.is_set():
            if engine.joins_step():
                step.waiting.append("a")
                engine.await_step()
            else:
                engine.token_boundary()
                clock.now += 0.013
                time.sleep(0.001)
        return "a"
    try:
        a = engine.submit(older, command=Command.TURN, about="a")
        time.sleep(0.05)
        b = engine.submit(newcomer, command=Command.TURN, about="b")
        assert b.result(10) == "b"
        newcomer_done.set()
        assert a.result(10) == "a"
    finally:
        engine.stop()
    with_b = [batch for batch in step.steps if "b" in batch]
    assert len(with_b) >= 19 and all(batch == ["a", "b"] for batch in with_b[:-1])   # a in every step b is in


def test_a_failed_shared_step_reaches_every_reply_that_waited(shared):
    engine, step = shared
    gate = hold(engine)
    futures = [engine.submit(decoder(engine, step, [], name, 5), command=Command.TURN, about=name) for name in "ab"]
    step.fail_with = RuntimeError("decode failed")
    gate.set()
    failures = [f.exception(10) for f in futures]
    assert any(isinstance(f, RuntimeError) and "decode failed" in str(f) for f in failures)
    assert engine.streaming() == []                                # nothing left parked
