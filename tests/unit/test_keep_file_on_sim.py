"""Keeping an attached file in context (`Engine.keep_file`, issue 46: what the user attached stays until they say
otherwise), on a whole Engine over the simulator: its saved blocks come back, no later turn evicts them, the KV file
keeps them kept, letting go makes them evictable again, and a budget that cannot hold the file beside a reply is
refused with the reason, changing nothing."""

from __future__ import annotations

import pytest
from helpers.sim_backend import SimBackend, sim_engine, sim_settings

from evoke_engine import BudgetError

pytestmark = pytest.mark.unit

NOTES = "\n".join(f"note {i} says the value {i} is kept" for i in range(16))


def _file_blocks(engine, conversation_id: str) -> list[dict]:
    return [b for b in engine.blocks(conversation_id) if b["role"] == "file"]


def test_a_kept_file_comes_back_stays_through_turns_and_a_reopen_until_let_go(tmp_path):
    backend = SimBackend(tmp_path / "sim.gguf")
    with sim_engine(backend, sim_settings(tmp_path, budget_tokens=384)) as (engine, _):
        conv = engine.new_conversation()
        conv.send("read this", [("notes.txt", NOTES)])
        for i in range(6):
            conv.send(f"something else entirely, number {i}, with quite a few words to fill the budget up")
        assert any(b["state"] != "resident" for b in _file_blocks(engine, conv.id))     # evicted meanwhile

        brought = conv.keep_file("notes.txt")
        blocks = _file_blocks(engine, conv.id)
        assert brought and all(b["state"] == "resident" and b["pinned"] for b in blocks)
        for i in range(3):
            conv.send(f"and another long message that needs room, number {i}, to push older blocks out")
        assert all(b["state"] == "resident" for b in _file_blocks(engine, conv.id))
        engine.check(conv.id)

        engine.release_conversation(conv.id)                        # to its KV file and back
        engine.open_conversation(conv.id).send("back again")
        assert all(b["state"] == "resident" and b["pinned"] for b in _file_blocks(engine, conv.id))

        assert conv.keep_file("notes.txt", keep=False) == []
        for i in range(4):
            conv.send(f"more talk that pushes the file out again, number {i}, with many more words in it")
        assert any(b["state"] != "resident" for b in _file_blocks(engine, conv.id))
        engine.check(conv.id)


def test_a_file_the_budget_cannot_hold_beside_a_reply_is_refused_and_nothing_changes(tmp_path):
    backend = SimBackend(tmp_path / "sim.gguf")
    with sim_engine(backend, sim_settings(tmp_path, budget_tokens=200)) as (engine, _):
        conv = engine.new_conversation()
        conv.send("read this", [("big.txt", NOTES * 4)])
        before = engine.blocks(conv.id)
        with pytest.raises(BudgetError, match="needs a budget of at least"):
            conv.keep_file("big.txt")
        assert engine.blocks(conv.id) == before
        with pytest.raises(KeyError, match="no attached file"):
            conv.keep_file("other.txt")


def test_a_budget_lowered_under_a_kept_file_is_refused_and_a_reply_is_never_cut(tmp_path):
    """Issue 58 item 12: keep a file at a roomy budget, then lower the budget under what holds it beside a reply
    (the conversation's own, the settings', a pin beside it): each is refused naming the kept blocks, and a long
    reply at the smallest budget allowed runs to max_tokens; reopened under a smaller settings budget, the
    conversation's budget still holds the kept file beside a reply."""
    backend = SimBackend(tmp_path / "sim.gguf")
    with sim_engine(backend, sim_settings(tmp_path, budget_tokens=600)) as (engine, _):
        conv = engine.new_conversation()
        bare = engine.min_budget_tokens()
        conv.send("read this", [("notes.txt", NOTES * 2)])
        conv.keep_file("notes.txt")
        holding = engine.min_budget_tokens()
        assert holding > bare
        with pytest.raises(BudgetError, match="kept files"):
            conv.set_budget(holding - 1)
        with pytest.raises(BudgetError, match="kept files"):
            engine.apply_settings(engine.settings.replace(budget_tokens=holding - 1))
        assert engine.settings.budget_tokens == 600
        conv.set_budget(holding)
        first_user = next(b["name"] for b in engine.blocks(conv.id) if b["role"] == "user")
        with pytest.raises(BudgetError, match="kept files"):
            conv.pin_block(first_user)
        backend.script(" ".join(f"word{i}" for i in range(400)))
        reply = conv.submit("write a long answer", max_tokens=300).result(timeout=60)
        assert reply.stopped == "max_tokens" and reply.n_tokens == 300
        engine.check(conv.id)

        conv.set_budget(None)                                   # follows the settings again, then closes
        engine.release_conversation(conv.id)
        engine.apply_settings(engine.settings.replace(budget_tokens=holding - 1))
        assert engine.open_conversation(conv.id).stats().budget_tokens >= holding
