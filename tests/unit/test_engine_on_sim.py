"""A whole Engine on the simulated backend (issue 47): loading, the conversation lifecycle (open, park, release,
reopen, delete), persistence (the KV file written and read back, across engines and reloads) and rebuilds from
history, with no model, each in milliseconds. What the engine's slot holds is checked token for token against the
live history through the chat template."""

from __future__ import annotations

import pytest
from helpers.sim_backend import SimBackend, conversation_text, rendered, sim_engine, sim_settings, slot_tokens

from evoke_engine import EventKind

pytestmark = pytest.mark.unit


@pytest.fixture
def backend(tmp_path):
    return SimBackend(tmp_path / "sim.gguf")


@pytest.fixture
def running(backend, tmp_path):
    with sim_engine(backend, sim_settings(tmp_path)) as (engine, events):
        yield engine, events


def kinds(events, conversation_id=None):
    return [e.kind for e in events if conversation_id is None or e.conversation_id == conversation_id]


def test_a_whole_engine_loads_on_the_simulated_backend(running, backend):
    engine, events = running
    assert engine.model_info().name == "simulated" and len(backend.opened) == 1
    assert EventKind.MODEL_LOADED in kinds(events)
    assert engine.diagnostics().rt is backend.rt            # the engine's runtime is the backend's


def test_a_turn_leaves_exactly_the_rendered_history_in_the_slot(running, backend):
    engine, _ = running
    backend.script("first answer.", "second answer.")
    conv = engine.new_conversation()
    assert conv.send("hello there") == "first answer."
    assert conv.send("and then?") == "second answer."
    assert [m["text"] for m in conv.messages()] == ["hello there", "first answer.", "and then?", "second answer."]
    assert conversation_text(engine, conv.id) == rendered(engine, conv.id)
    engine.check(conv.id)


def test_more_conversations_than_slots_park_and_come_back_whole(running):
    engine, events = running                     # two slots
    convs = [engine.new_conversation() for _ in range(3)]
    for i, conv in enumerate(convs):
        conv.send(f"question {i}")
    assert EventKind.PARKED in kinds(events)
    first = convs[0]
    first.send("back to the first")              # into a slot again: its parked cells come back
    assert conversation_text(engine, first.id) == rendered(engine, first.id)
    assert [m["text"] for m in first.messages()][::2] == ["question 0", "back to the first"]
    engine.check(first.id)


def test_release_writes_a_kv_file_and_reopening_restores_it_without_decoding_history(running, backend):
    engine, events = running
    conv = engine.new_conversation()
    conv.send("remember the number 41")
    before = slot_tokens(engine, conv.id)
    engine.release_conversation(conv.id)
    engine.wait_idle()
    assert EventKind.KV_PERSISTED in kinds(events, conv.id) and engine.kvfiles.has(conv.id)
    decoded = len(backend.rt.decoded)
    again = engine.open_conversation(conv.id)
    assert EventKind.KV_RESTORED in kinds(events, conv.id)
    assert slot_tokens(engine, again.id) == before
    assert len(backend.rt.decoded) == decoded, "a restore decodes nothing"
    assert again.send("what was it?") == "reply 2."
    assert conversation_text(engine, conv.id) == rendered(engine, conv.id)


def test_a_kv_file_outlives_the_engine(backend, tmp_path):
    settings = sim_settings(tmp_path)
    with sim_engine(backend, settings) as (engine, _):
        conv = engine.new_conversation()
        conv.send("one")
        conv.send("two")
        before, conversation_id = slot_tokens(engine, conv.id), conv.id
    with sim_engine(backend, settings) as (engine, events):       # a new process: the same model file
        reopened = engine.open_conversation(conversation_id)
        assert EventKind.KV_RESTORED in kinds(events, conversation_id)
        assert slot_tokens(engine, conversation_id) == before
        assert [s for s, _, _ in backend.rt.decoded] == [settings.slots], "only the shared prefix was decoded"
        reopened.send("three")
        assert conversation_text(engine, conversation_id) == rendered(engine, conversation_id)


def test_an_unloaded_model_comes_back_with_its_conversations(running, backend):
    engine, events = running
    conv = engine.new_conversation()
    conv.send("before the unload")
    engine.unload_model()
    assert not engine.model_loaded and backend.opened[0].closed
    assert conv.send("after it") == "reply 2."
    assert len(backend.opened) == 2 and EventKind.MODEL_UNLOADED in kinds(events)
    assert [m["text"] for m in conv.messages()] == ["before the unload", "reply 1.", "after it", "reply 2."]
    assert conversation_text(engine, conv.id) == rendered(engine, conv.id)


def test_a_corrupt_kv_file_is_rebuilt_from_history_to_the_same_cells(running, backend):
    engine, events = running
    conv = engine.new_conversation()
    conv.send("a question")
    conv.send("another")
    before = slot_tokens(engine, conv.id)
    engine.release_conversation(conv.id)
    engine.wait_idle()
    files = [p for p in engine.kvfiles.directory.rglob("*") if p.is_file() and conv.id in p.name]
    assert files
    for path in files:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    engine.open_conversation(conv.id)
    rebuilt = [e for e in events if e.kind is EventKind.KV_REBUILT and e.conversation_id == conv.id]
    assert rebuilt and "unusable" in rebuilt[0].message
    after = slot_tokens(engine, conv.id)                      # SQLite's text re-prefilled gives the same cells
    assert after == before[:len(after)]
    assert conversation_text(engine, conv.id) == rendered(engine, conv.id, held_opening=False)
    engine.check(conv.id)


def test_a_conversation_without_a_file_is_rebuilt_from_history(running, backend):
    engine, _ = running
    conv = engine.new_conversation()
    conv.send("no file for this one")
    before = slot_tokens(engine, conv.id)
    engine.release_conversation(conv.id, persist=False)
    engine.wait_idle()
    assert not engine.kvfiles.has(conv.id)
    engine.open_conversation(conv.id)
    after = slot_tokens(engine, conv.id)
    assert after == before[:len(after)]
    assert conversation_text(engine, conv.id) == rendered(engine, conv.id, held_opening=False)


def test_a_deleted_conversation_leaves_no_file_no_cells_and_no_listing(running):
    engine, _ = running
    conv = engine.new_conversation()
    conv.send("to be deleted")
    engine.persist(conv.id)
    assert engine.kvfiles.has(conv.id)
    engine.delete_conversation(conv.id)
    engine.wait_idle()
    assert not engine.kvfiles.has(conv.id)
    assert conv.id not in [info.id for info in engine.conversations()]
    assert engine.diagnostics().slots.slot_of(conv.id) is None


# -- the seam itself --------------------------------------------------------------------------------------------
def test_the_engine_builds_on_llama_cpp_unless_given_a_backend():
    import inspect

    from evoke_engine import Engine
    from evoke_engine.conversations.loaded_model import LoadedModel
    from evoke_engine.runtime.backend import LLAMA_CPP

    assert inspect.signature(Engine).parameters["backend"].default is LLAMA_CPP
    assert inspect.signature(LoadedModel.load).parameters["backend"].default is LLAMA_CPP


def test_a_simulated_runtime_samples_its_script(backend, tmp_path):
    from helpers.sim_backend import ScriptedSampler

    from evoke_engine.runtime.sampling import SamplingParams

    rt = backend.open(sim_settings(tmp_path), lambda event: None).rt
    backend.script("two words")
    sampler = rt.sampler(SamplingParams(), 0)
    assert isinstance(sampler, ScriptedSampler)
    assert rt.detokenize([sampler.sample(), sampler.sample()]) == "two words" and rt.is_eog(sampler.sample())


def test_the_simulators_saved_bytes_walk_as_a_llama_cpp_state(backend, tmp_path):
    """What lets a KV file written over the simulator pass the engine's checks and its chunk cuts."""
    from evoke_engine.kvcache.state_cells import cut
    from evoke_engine.memory.snapshot_check import check_blob

    parts = backend.open(sim_settings(tmp_path), lambda event: None)
    parts.rt.decode(parts.rt.tokenize("a b c d e f "), 0, 0)
    saved = parts.kv.save(0, 1, 5)
    assert check_blob("image", saved.data, 1, 4)[3] == 1                     # one layer
    assert cut(saved.data, 2, 4) == parts.kv.save(0, 2, 4).data
