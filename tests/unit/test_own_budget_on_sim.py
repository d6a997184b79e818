"""A conversation's own budget (`Engine.set_budget`) against the settings' one, on a whole Engine over the simulator:
a conversation with a budget of its own keeps it when the settings' budget changes and when it is reopened from its
KV file; the others follow the settings, also when they reopen after the settings changed while they were closed."""

from __future__ import annotations

import dataclasses

import pytest
from helpers.sim_backend import SimBackend, sim_engine, sim_settings

pytestmark = pytest.mark.unit


def _budget(engine, conversation_id: str) -> int:
    return engine.stats(conversation_id).budget_tokens


def test_an_own_budget_outlives_settings_changes_and_a_reopen_and_the_others_follow_the_settings(tmp_path):
    backend = SimBackend(tmp_path / "sim.gguf")
    settings = sim_settings(tmp_path, budget_tokens=512)
    with sim_engine(backend, settings) as (engine, _):
        own, follows = engine.new_conversation(), engine.new_conversation()
        for conv in (own, follows):
            conv.send("hello there")
        engine.set_budget(own.id, 768)
        engine.wait_idle()
        assert (_budget(engine, own.id), _budget(engine, follows.id)) == (768, 512)

        engine.apply_settings(dataclasses.replace(engine.settings, budget_tokens=640))
        engine.wait_idle()
        own.send("still here?")
        follows.send("still here?")
        assert (_budget(engine, own.id), _budget(engine, follows.id)) == (768, 640)

        for conv in (own, follows):
            engine.release_conversation(conv.id)            # persisted to their KV files
        engine.apply_settings(dataclasses.replace(engine.settings, budget_tokens=896))
        engine.wait_idle()
        for conv in (own, follows):
            engine.open_conversation(conv.id).send("back again")
        assert (_budget(engine, own.id), _budget(engine, follows.id)) == (768, 896)

        engine.set_budget(own.id, None)                      # follows the settings again
        engine.wait_idle()
        own.send("and now?")
        assert _budget(engine, own.id) == 896
