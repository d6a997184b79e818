"""A turn prepared while its message was typed (`Engine.prepare_ahead`, issue 44): the input rendered and tokenized,
its recovery decided and brought back and its tokens decoded ahead before Enter; the turn that sends the same text
then restores nothing more within the room and claims the decoded tokens, and its blocks, tokens and greedy reply
are those of a turn that was not prepared."""

from __future__ import annotations

import pytest

from evoke_engine import Engine, Settings
from evoke_engine.events import EventKind

pytestmark = pytest.mark.model

NOTES = "\n".join(f"Note {i}: the cache on host {i} is flushed at {i}:15 every night." for i in range(40))
DRAFT = "And the cache on host 12: when is that one flushed?"


def _recoveries(events, conversation_id):
    return [e.block for e in events if e.kind is EventKind.RECOVERED and e.conversation_id == conversation_id]


def test_a_prepared_turn_restored_ahead_and_replies_as_an_unprepared_one(tmp_path):
    settings = Settings(home=str(tmp_path), budget_tokens=256, n_ctx=4096, slots=2, block_tokens=32,
                        embedder="off", recall_signal="lexical", chunk_reuse=False)
    events = []
    with Engine(settings, prewarm=False, scheduler=False) as engine:
        engine.subscribe(events.append)
        typed, plain = (engine.new_conversation(system_prompt="You are brief.", tools=[]) for _ in range(2))
        for conv in (typed, plain):
            conv.send("Keep these notes.", [("notes.txt", NOTES)], max_tokens=2, temperature=0)
            conv.send("Thanks. Anything else?", max_tokens=4, temperature=0)
        engine.wait_idle()
        assert engine.stats(typed.id).evictions > 0

        events.clear()
        assert engine.prepare_ahead(typed.id, DRAFT, max_tokens=8).result() is True
        ahead = _recoveries(events, typed.id)
        assert ahead, "the draft's recovery came back before Enter"
        kv = engine.diagnostics().kv
        claimed = kv.ahead_claimed
        typed_reply = typed.submit(DRAFT, max_tokens=8, temperature=0).result()
        assert kv.ahead_claimed - claimed >= len(engine.tokenize(DRAFT)) - 1    # its tokens decoded while typed
        plain_reply = plain.submit(DRAFT, max_tokens=8, temperature=0).result()

        assert _recoveries(events, typed.id) == ahead                      # the turn restored nothing more
        assert typed_reply.recovered == ahead                              # and counts them as its own
        assert typed_reply.recovered == plain_reply.recovered
        assert typed_reply.text == plain_reply.text
        shape = [[(b["name"], b["tokens"], b["state"]) for b in engine.blocks(c.id)] for c in (typed, plain)]
        assert shape[0] == shape[1]
        engine.check(typed.id)


def test_a_draft_that_changes_before_enter_is_decided_afresh_and_typing_opens_nothing(tmp_path):
    settings = Settings(home=str(tmp_path), budget_tokens=256, n_ctx=2048, slots=1, block_tokens=32,
                        embedder="off", recall_signal="lexical")
    with Engine(settings, prewarm=False, scheduler=False) as engine:
        conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
        conv.send("Keep these notes.", [("notes.txt", NOTES)], max_tokens=2, temperature=0)
        engine.wait_idle()
        assert engine.prepare_ahead(conv.id, DRAFT).result() is True
        reply = conv.submit(DRAFT + " Thanks.", max_tokens=4, temperature=0).result()     # not the draft
        assert reply.n_tokens > 0
        engine.check(conv.id)
        engine.release_conversation(conv.id)
        engine.wait_idle()
        assert engine.prepare_ahead(conv.id, DRAFT).result() is False                     # closed: not opened
