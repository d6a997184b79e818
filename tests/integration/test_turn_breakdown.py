"""Every reply says where its turn went (issue 44): recovery decision, embedding, restores, prompt decode, sampling,
token decode, detokenising and the engine's own Python, for the whole turn and up to the first token; the
conversation's stats carry the last turn's, and the reply's stored metrics keep it."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest

from evoke_engine import Engine, Settings
from evoke_engine.conversations.breakdown import PHASES
from evoke_engine.conversations.reply_row import reply_metrics


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    settings = Settings(home=str(tmp_path_factory.mktemp("breakdown")), budget_tokens=320, n_ctx=2048, slots=1,
                        embedder="off")
    with Engine(settings, prewarm=False) as eng:
        yield eng


def test_a_replys_breakdown_adds_up_to_its_first_token_and_its_turn(engine):
    conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
    reply = conv.submit("Name three colours.", max_tokens=12, temperature=0).result()
    whole, first = reply.breakdown, reply.breakdown["first_token"]
    for part in (whole, first):
        assert all(part[f"{phase}_s"] >= 0 for phase in PHASES) and part["python_s"] >= 0
        assert sum(part[f"{phase}_s"] for phase in PHASES) + part["python_s"] == pytest.approx(part["total_s"],
                                                                                               abs=1e-5)
    assert first["total_s"] == pytest.approx(reply.ttft_s, abs=1e-5)
    assert first["prompt_decode_s"] > 0 and first["sample_s"] > 0 and first["token_decode_s"] == 0
    assert whole["token_decode_s"] > 0 and whole["total_s"] >= first["total_s"]
    assert conv.stats().turn_breakdown == whole
    assert reply_metrics(reply)["metrics"]["breakdown"] == whole


@contextmanager
def _engine_with_notes(tmp_path):
    """An engine whose conversation holds 30 notes under a budget that evicts most of them, idle: the embedder
    warmed and the blocks' vectors made."""
    settings = Settings(home=str(tmp_path), budget_tokens=256, n_ctx=2048, slots=1, block_tokens=32)
    with Engine(settings, prewarm=False, scheduler=False) as engine:
        conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
        notes = "\n".join(f"Note {i}: the cache on host {i} is flushed at {i}:15 every night." for i in range(30))
        conv.send("Keep these notes.", [("notes.txt", notes)], max_tokens=2, temperature=0)
        engine.wait_idle()
        yield engine, conv


def test_a_message_embedded_while_typed_costs_its_turn_no_embedding(tmp_path):
    """The window hands a paused draft to `embed_ahead`; the turn that sends the same text then decides without
    embedding (its breakdown's embed phase is zero), while one not typed ahead embeds its message."""
    with _engine_with_notes(tmp_path) as (engine, conv):
        cold = conv.submit("When is the cache on host 7 flushed?", max_tokens=2, temperature=0).result()
        assert conv.stats().evictions > 0 and cold.breakdown["embed_s"] > 0
        engine.wait_idle()
        draft = "And the cache on host 12: when is that one flushed?"
        engine.embed_ahead(draft).result()
        typed = conv.submit(draft, max_tokens=2, temperature=0).result()
        assert typed.breakdown["decide_s"] > 0 and typed.breakdown["embed_s"] == 0


def test_a_draft_embedded_as_it_is_typed_is_not_embedded_again_by_its_turn(tmp_path):
    """The window starts a draft's vector at a short pause (`Engine.embed_draft`, on the embedder's own thread): the
    turn that sends that text right after decides with that very vector; another text is embedded by its turn."""
    with _engine_with_notes(tmp_path) as (engine, conv):
        embedder = engine.diagnostics().embedder
        draft = "And the cache on host 12: when is that one flushed?"
        engine.embed_draft(draft)
        started = embedder._soon[draft]                  # on its way at once
        reply = conv.submit(draft, max_tokens=2, temperature=0).result()
        assert conv.stats().evictions > 0 and reply.breakdown["decide_s"] > 0
        assert draft not in embedder._soon and np.shares_memory(embedder.embed_one(draft), started.result())
        other = conv.submit("When is the cache on host 3 flushed?", max_tokens=2, temperature=0).result()
        assert other.breakdown["embed_s"] > 0
