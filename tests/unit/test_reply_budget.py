"""The budget never cuts a reply: `turn.run_turn` on the fake KV cache with a scripted sampler (the reply
loop is the engine's logic; what a model would sample is not under test here)."""

from __future__ import annotations

import threading

import pytest
from helpers.rig import Rig

from evoke_engine.conversations import turn as turn_module
from evoke_engine.events import EventKind
from evoke_engine.kvcache.blocks import BlockState
from evoke_engine.runtime.sampling import SamplingParams
from evoke_engine.runtime.template import ChatTemplate

pytestmark = pytest.mark.unit


class ScriptedSampler:
    """Hands out a fixed reply, then end-of-generation; checks the budget before every token."""

    script: list[int] = []
    memory = None
    peak = 0

    def __init__(self, params, ctx, n_vocab) -> None:
        self.tokens = iter(self.script)
        self.first = True

    def sample(self) -> int:
        """`peak`: active tokens while the reply grows (after its first token: the prompt's own decode is
        held to the turn-end invariant only)."""
        cls = ScriptedSampler
        if not self.first:
            cls.peak = max(cls.peak, cls.memory.active_tokens)
        self.first = False
        return next(self.tokens, cls.eos)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


@pytest.fixture
def smallest(tmp_path, monkeypatch):
    rig = Rig(tmp_path)
    memory = rig.memory()
    memory.set_budget(memory.min_budget_tokens())
    ScriptedSampler.memory, ScriptedSampler.peak, ScriptedSampler.eos = memory, 0, rig.rt.vocab.eos
    monkeypatch.setattr(rig.rt, "sampler", lambda params, context, seq=None: ScriptedSampler(params, None, 0),
                        raising=False)
    yield rig, memory
    rig.close()


def _turn(rig, memory, history, text, reply_tokens, max_tokens=10_000):
    ScriptedSampler.script = rig.tokens_for(reply_tokens, f"reply{memory.turn + 1}")
    return turn_module.run_turn(memory, rig.rt, ChatTemplate(None), history, text, [],
                                SamplingParams(max_tokens=max_tokens), None, threading.Event())


def test_a_reply_three_budgets_long_runs_to_its_end(smallest):
    rig, memory = smallest
    budget = memory.budget_tokens
    reply = _turn(rig, memory, [], "tell me a long story", 3 * budget)
    assert (reply.n_tokens, reply.stopped) == (3 * budget, "eos")
    assert ScriptedSampler.peak <= budget and memory.active_tokens <= budget
    memory.check()
    parts = [b for b in memory.table.blocks if b.name.startswith("assistant#1")]
    assert all(b.n_tokens <= memory.settings.block_tokens for b in parts)
    assert [t for b in parts for t in b.tokens][-3 * budget - 2:-2] == ScriptedSampler.script   # + the closing
    assert any(b.state is BlockState.RAM for b in parts)           # older parts left, saved, recoverable


def test_max_tokens_stops_a_reply_not_the_budget(smallest):
    rig, memory = smallest
    reply = _turn(rig, memory, [], "count", 500, max_tokens=120)
    assert (reply.n_tokens, reply.stopped) == (120, "max_tokens")


def test_every_later_turn_replies_in_full_at_the_smallest_budget(smallest):
    rig, memory = smallest
    history: list[dict] = []
    for n in (150, 40, 90, 200, 10):
        reply = _turn(rig, memory, history, f"question {n} " * 3, n)
        assert (reply.n_tokens, reply.stopped) == (n, "eos")
        assert memory.active_tokens <= memory.budget_tokens
        memory.check()
        layout = rig.kv.layout(memory.seq)
        assert layout[:memory.active_tokens] == rig.expected_layout(memory)
    assert ScriptedSampler.peak <= memory.budget_tokens
    assert not [e for e in rig.events if e.kind is EventKind.ERROR]
    assert [m["role"] for m in history] == ["user", "assistant"] * 5


def test_the_next_opening_is_held_ahead_and_claimed(smallest):
    rig, memory = smallest
    history: list[dict] = []
    _turn(rig, memory, history, "first", 20)
    assert rig.kv.ahead_tokens(memory.seq) > 0
    _turn(rig, memory, history, "second", 20)
    assert rig.kv.ahead_claimed > 0
    memory.check()
