"""The budget never cuts a reply (issue 24 #1): a budget below the smallest that works is refused with a
message naming it; at that smallest budget a long reply runs on past the room the budget leaves (to max_tokens or
its own end, never cut) and every later turn replies in full, the reply's own older blocks leaving (saved,
recoverable) like any other."""

from __future__ import annotations

import pytest

from evoke_engine import BudgetError, Engine, Settings
from evoke_engine.events import EventKind
from evoke_engine.memory.memory import min_budget_tokens

LONG = "Write a very long story about a dragon."
QUESTIONS = ["Write a long story about a dragon who loves numbers.", "Explain how a car engine works, in detail.",
             "List fifty animals, one per line.", "Describe your ideal city at length.",
             "Count from 500 down to 1, separated by commas.", "Write a long poem about the sea.",
             "Explain photosynthesis step by step.", "Write a recipe for bread, with every step.",
             "Tell the history of computers.", "Count from 1 to 300 in words."]


@pytest.mark.parametrize("tail_fraction", [0.0, 0.15, 0.5])
@pytest.mark.parametrize("prefix", [0, 9, 349, 2000])
def test_the_smallest_budget_holds_the_prefix_the_tail_and_one_block(prefix, tail_fraction):
    settings = Settings(tail_fraction=tail_fraction, block_tokens=128)
    smallest = min_budget_tokens(prefix, settings)
    held = prefix + 128 + (0 if prefix else 128)           # the sink is a block when there is no prefix

    def fits(budget: int) -> bool:
        return budget - int(budget * tail_fraction) >= held

    assert fits(smallest) and not fits(smallest - 1)


@pytest.mark.slow
def test_at_the_smallest_budget_no_reply_is_cut(tmp_path):
    settings = Settings(home=str(tmp_path), n_ctx=4096, slots=2, temperature=0.0)
    with Engine(settings, scheduler=False) as engine:
        smallest = engine.min_budget_tokens()
        errors: list[str] = []
        engine.subscribe(lambda e: errors.append(e.message) if e.kind is EventKind.ERROR else None)
        with pytest.raises(BudgetError, match=f"smallest budget that works is {smallest} tokens"):
            engine.apply_settings(settings.replace(budget_tokens=smallest - 1))
        assert engine.settings.budget_tokens == settings.budget_tokens          # refused: nothing changed
        engine.apply_settings(settings.replace(budget_tokens=smallest))

        conv = engine.new_conversation()                                        # the default system prompt, tools
        prefix = conv.stats().prefix_tokens
        assert prefix > 300 and smallest < 2 * prefix
        with pytest.raises(BudgetError, match=f"smallest budget that works is {smallest} tokens"):
            conv.set_budget(smallest - 1)

        reply = conv.submit(LONG, max_tokens=600, temperature=0).result()
        # never "budget": it runs past the room the budget leaves after the prefix, to max_tokens or its own end
        assert reply.stopped in ("max_tokens", "eos") and reply.n_tokens > smallest - prefix, (reply.n_tokens,
                                                                                               reply.stopped)
        stats = conv.stats()
        assert stats.active_tokens <= smallest
        saved = [b for b in stats.blocks if b["name"].startswith("assistant#1") and b["state"] in ("ram", "disk")]
        assert saved                                  # the reply's older blocks left and can come back
        conv.check()

        for turn, question in enumerate(QUESTIONS, start=2):
            reply = conv.submit(question, max_tokens=96, temperature=0).result()
            assert reply.stopped in ("eos", "max_tokens") and reply.n_tokens > 0, (turn, reply.stopped)
            stats = conv.stats()
            assert stats.active_tokens <= smallest, (turn, stats.active_tokens)
            conv.check()
        assert not [m for m in errors if "budget" in m or "protected" in m]

