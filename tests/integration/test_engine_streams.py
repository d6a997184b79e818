"""Replies streamed together on the real embedded model (issue 59), in both shapes: a context a slot (the replies
take turns a step at a time) and one context for all (their tokens share each step's decode). Greedy replies
together are token for token those of the same conversations alone (in one shared context not promised: see the
test); the second reply's first token comes before the first reply ends; a raw completion runs between a reply's
steps; Stop in one conversation stops only its own reply. In one context the comparison runs with flash attention
on: llama.cpp's CPU kernel skips other sequences' masked cells, where without it their count changes the softmax's
rounding (a reply alone then differs with the other conversations in the cache, batched or not)."""

from __future__ import annotations

import threading

import pytest

from evoke_engine import Engine, Settings
from evoke_engine.worker import Command

QUESTIONS = ["Write a short poem about the sea.", "List five fruits.", "Explain what a compiler does."]


SHAPES = {"a stream a slot": {}, "a context a slot": {"slot_layout": "contexts"},
          "one unified cache": {"slot_layout": "unified", "flash_attention": "on"}}


def settings_in(home, **shape) -> Settings:
    return Settings(home=str(home), budget_tokens=1024, n_ctx=4096, slots=4, parallel_replies=3, embedder="off",
                    **shape)


def held(engine: Engine) -> threading.Event:
    """Occupy the engine thread until the returned event is set: what is submitted meanwhile starts together."""
    gate, started = threading.Event(), threading.Event()
    engine.thread.submit(lambda: (started.set(), gate.wait(30)), command=Command.READ)
    started.wait(30)
    return gate


@pytest.fixture(scope="module", params=list(SHAPES))
def engine(request, tmp_path_factory):
    with Engine(settings_in(tmp_path_factory.mktemp("streams"), **SHAPES[request.param]), prewarm=False) as eng:
        yield eng


def test_greedy_replies_together_equal_each_alone(engine):
    alone = [engine.new_conversation().submit(q, max_tokens=40, temperature=0).result().text for q in QUESTIONS]
    heard: list[int] = []
    convs = [engine.new_conversation() for _ in QUESTIONS]
    gate = held(engine)
    futures = [conv.submit(q, max_tokens=40, temperature=0, on_token=lambda _p, i=i: heard.append(i))
               for i, (conv, q) in enumerate(zip(convs, QUESTIONS, strict=True))]
    shared = engine.diagnostics().rt.step_batch
    steps_before, tokens_before = shared.steps, shared.tokens
    gate.set()
    together = [f.result().text for f in futures]
    last_of_first = len(heard) - 1 - heard[::-1].index(0)
    assert heard.index(1) < last_of_first and heard.index(2) < last_of_first     # they streamed together
    for conv in convs:
        conv.check()
    if engine.settings.slot_layout == "contexts":                  # each token decoded alone, in its own context
        assert together == alone
        return
    steps, tokens = shared.steps - steps_before, shared.tokens - tokens_before
    assert steps >= 20 and tokens >= 2 * steps                     # their tokens went through shared decodes
    if engine.settings.slot_layout == "streams":                   # each stream's attention over its own cells
        assert together == alone
        return
    if together != alone:
        # 2 runs of 10 on 2026-11-28: which replies share a decode follows timing, and llama.cpp's CPU kernels do not
        # promise a token decoded beside other sequences the rounding it gets alone (docs/benchmarks.md)
        pytest.xfail("a batched greedy reply differed from the same request alone (one shared context)")


def test_a_raw_completion_runs_between_a_replys_steps(engine):
    conv = engine.new_conversation()
    order: list[str] = []
    gate = held(engine)
    reply = conv.submit("Count from one to thirty in words.", max_tokens=120, temperature=0,
                        on_token=lambda _p: order.append("reply"))
    completion = engine.complete(engine.tokenize("def add(a, b):\n    return", special=False),
                                 max_tokens=8, temperature=0, on_token=lambda _p: order.append("completion"))
    gate.set()
    completion.result(), reply.result()
    assert "completion" in order and order[-1] == "reply"                  # done before the reply ended


def test_stop_in_one_conversation_stops_only_its_reply(engine):
    a, b = engine.new_conversation(), engine.new_conversation()
    heard: list[str] = []
    gate = held(engine)
    first = a.submit("Write a long story about a dragon.", max_tokens=200, temperature=0,
                     on_token=lambda _p: heard.append("a"))
    second = b.submit("Write a long story about a knight.", max_tokens=60, temperature=0,
                      on_token=lambda _p: heard.append("b"))
    gate.set()
    while heard.count("a") < 5:
        threading.Event().wait(0.01)
    engine.cancel(a.id)
    assert first.result().stopped == "cancelled"
    reply = second.result()
    assert reply.stopped in ("eos", "max_tokens") and reply.n_tokens > 5
    a.check(), b.check()
