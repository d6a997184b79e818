"""A turn prepared while its message is typed (`Engine.prepare_ahead`, issue 44) on a whole Engine over the
simulator: a one-block draft's tokens are decoded at the tail ahead of it, so the turn that sends it decodes only
its last token and the reply; typing on decodes only what was added; a message other than the draft leaves no
stale cell. The slot always holds exactly the rendered history, token for token."""

from __future__ import annotations

import pytest
from helpers.sim_backend import SimBackend, conversation_text, rendered, sim_engine, sim_settings

pytestmark = pytest.mark.unit

DRAFT = "where did we put the config file for the staging deploy?"


@pytest.fixture
def running(tmp_path):
    backend = SimBackend(tmp_path / "sim.gguf")
    with sim_engine(backend, sim_settings(tmp_path)) as (engine, _):
        yield engine


def _decoded(engine) -> int:
    return sum(n for _, _, n in engine.diagnostics().rt.decoded)


def _turn_decodes(engine, conv, text: str) -> int:
    before = _decoded(engine)
    conv.send(text)
    return _decoded(engine) - before


def test_a_typed_draft_is_decoded_ahead_and_its_turn_decodes_only_the_rest(running):
    engine = running
    typed, plain = engine.new_conversation(), engine.new_conversation()
    for conv in (typed, plain):
        conv.send("hello there")
    before = _decoded(engine)
    assert engine.prepare_ahead(typed.id, DRAFT).result() is True
    ahead = _decoded(engine) - before
    assert ahead > 5                                              # the draft's tokens, past the held opening
    typed_at_enter, plain_at_enter = _turn_decodes(engine, typed, DRAFT), _turn_decodes(engine, plain, DRAFT)
    assert typed_at_enter == plain_at_enter - ahead                # what was decoded ahead is not decoded again
    for conv in (typed, plain):
        assert conversation_text(engine, conv.id) == rendered(engine, conv.id)
        engine.check(conv.id)


def test_typing_on_decodes_only_what_was_added(running):
    engine = running
    conv = engine.new_conversation()
    conv.send("hello there")
    before = _decoded(engine)
    engine.prepare_ahead(conv.id, "where did we put").result()
    first = _decoded(engine) - before
    engine.prepare_ahead(conv.id, DRAFT).result()
    second = _decoded(engine) - before - first
    engine.prepare_ahead(conv.id, DRAFT).result()                 # a pause with nothing new typed
    assert 0 < second < first + second and _decoded(engine) - before == first + second
    conv.send(DRAFT)
    assert conversation_text(engine, conv.id) == rendered(engine, conv.id)
    engine.check(conv.id)


def test_a_message_other_than_the_draft_leaves_no_stale_cell(running):
    engine = running
    conv = engine.new_conversation()
    conv.send("hello there")
    engine.prepare_ahead(conv.id, DRAFT).result()
    conv.send("something else entirely")
    assert conversation_text(engine, conv.id) == rendered(engine, conv.id)
    engine.check(conv.id)
    engine.prepare_ahead(conv.id, DRAFT).result()
    engine.release_conversation(conv.id)                          # a KV file written while a draft is held
    engine.open_conversation(conv.id).send(DRAFT)
    assert conversation_text(engine, conv.id) == rendered(engine, conv.id)
    engine.check(conv.id)
