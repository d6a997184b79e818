"""Editing on the real embedded model: regenerate, edit, fork, delete, export/import, a failed turn.

Each edited conversation is checked against a clean rebuild of the same history (its JSON export
imported as a new conversation, whose KV is re-prefilled from SQLite): greedy replies must match.
"""

from __future__ import annotations

import json

import pytest

from evoke_engine import EditError, Engine, ImportFormatError, Settings

GREEDY = {"temperature": 0, "max_tokens": 12}
DOCUMENT = ("Deployment notes\n\nThe staging host restarts at midnight.\n\n"
            "The passkey is 7316. Remember the passkey 7316.\n\nLogs rotate every week.\n")
# answered from turn 1's file, so a wrong cache shows
PROBE = "What is the passkey in the document? Answer with the number."
TURNS = ["Please read notes.txt.", "Name a color of the sky.", "What is two plus three?"]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    settings = Settings(home=str(tmp_path_factory.mktemp("editing")), budget_tokens=2048, n_ctx=8192, slots=4)
    with Engine(settings, scheduler=False, prewarm=False) as eng:
        yield eng


def chat(engine, turns=TURNS):
    conv = engine.new_conversation(system_prompt="You are a concise assistant.")
    for i, text in enumerate(turns):
        conv.send(text, attachments=[("notes.txt", DOCUMENT)] if i == 0 else (), max_tokens=10, temperature=0)
    return conv


def clean_probe(engine, conv) -> str:
    """The probe's greedy reply on a clean re-prefill of `conv`'s current history."""
    clone = engine.import_conversation(conv.export("json"))
    try:
        return clone.send(PROBE, **GREEDY)
    finally:
        engine.delete_conversation(clone.id)


def probe_matches_clean_rebuild(engine, conv) -> None:
    expected = clean_probe(engine, conv)
    conv.check()
    reply = conv.send(PROBE, **GREEDY)
    assert reply == expected
    assert "7316" in reply
    conv.check()


def test_regenerate_drops_the_reply_cells_and_samples_again_without_prefill(engine):
    conv = chat(engine)
    before = conv.messages()
    prefilled = conv.stats().prefill_tokens
    reply = conv.regenerate(**{**GREEDY, "max_tokens": 10}).result()
    after = conv.messages()
    assert reply.prefill_tokens == 0 and conv.stats().prefill_tokens == prefilled
    assert reply.text == before[-1]["text"]                         # greedy: the same reply again
    assert [m["text"] for m in after] == [m["text"] for m in before]
    assert after[-1]["id"] != before[-1]["id"]
    hidden = engine.history.messages(conv.id, include_hidden=True)
    assert [m.status for m in hidden].count("superseded") == 1
    probe_matches_clean_rebuild(engine, conv)


@pytest.mark.parametrize("index", [0, 2, 4])
def test_edit_rolls_back_to_the_message_and_matches_a_clean_rebuild(engine, index):
    conv = chat(engine)
    old = conv.messages()
    conv.edit(index, "What is the largest planet?", **GREEDY).result()
    new = conv.messages()
    assert len(new) == index + 2
    assert [m["text"] for m in new[:index]] == [m["text"] for m in old[:index]]
    assert new[index]["text"] == "What is the largest planet?"
    versions = engine.history.messages(conv.id, include_hidden=True)
    assert next(m for m in versions if m.id == new[index]["id"]).previous_id == old[index]["id"]
    probe_matches_clean_rebuild(engine, conv)


def test_edit_of_a_reply_is_refused_and_changes_nothing(engine):
    conv = chat(engine, TURNS[:1])
    with pytest.raises(EditError, match="not a user message"):
        conv.edit(1, "rewritten reply").result()
    assert len(conv.messages()) == 2
    conv.check()


def test_fork_shares_the_parent_cells_and_both_branches_continue(engine):
    parent = chat(engine)
    child = parent.fork(3)                                          # up to the second reply
    assert [m["text"] for m in child.messages()] == [m["text"] for m in parent.messages()[:4]]
    stats = child.stats()
    assert stats.prefill_tokens == 0                             # nothing decoded for the fork
    assert any(b["sibling_shared"] for b in stats.blocks)
    info = {c.id: c for c in engine.conversations()}
    assert info[child.id].forked_from == parent.id
    parent.check()
    child.check()
    child.send("And what is the smallest planet?", **GREEDY)       # the child's tail and the parent's
    parent.send("What is ten minus four?", **GREEDY)               # grow apart without touching each other
    probe_matches_clean_rebuild(engine, child)
    probe_matches_clean_rebuild(engine, parent)


def test_delete_in_the_middle_matches_a_clean_rebuild(engine):
    conv = chat(engine)
    texts = [m["text"] for m in conv.messages()]
    conv.delete_message(2)
    assert [m["text"] for m in conv.messages()] == texts[:2] + texts[3:]
    assert engine.history.messages(conv.id, include_hidden=True)[2].status == "deleted"
    probe_matches_clean_rebuild(engine, conv)
    assert engine.compact_history(conv.id) == 1


def test_a_failed_turn_rolls_back_history_and_kv(engine):
    conv = chat(engine, TURNS[:2])
    before = conv.messages()
    stats = conv.stats()

    def explode(piece):
        raise RuntimeError("observer broke")

    with pytest.raises(RuntimeError, match="observer broke"):
        conv.submit("This turn will fail.", on_token=explode, **GREEDY).result()
    assert conv.messages() == before
    assert conv.stats().active_tokens == stats.active_tokens
    probe_matches_clean_rebuild(engine, conv)


def test_export_import_round_trip_and_bad_files(engine):
    conv = chat(engine, TURNS[:1])
    conv.send("Summarise this file.", attachments=[("notes.md", "# Notes\nThe build uses make.\n")], **GREEDY)
    markdown = conv.export("markdown")
    assert "## User" in markdown and "notes.md" in markdown and "The build uses make." in markdown
    data = json.loads(conv.export("json"))
    clone = engine.import_conversation(data)
    assert [(m["role"], m["text"], m["attachments"]) for m in clone.messages()] == \
        [(m["role"], m["text"], m["attachments"]) for m in conv.messages()]
    for bad, reason in [("{", "not a JSON"), ({"format": "other"}, "not an Evoke"),
                        ({**data, "version": 99}, "version"), ({**data, "messages": [{"role": "x"}]}, "message 0")]:
        with pytest.raises(ImportFormatError, match=reason):
            engine.import_conversation(bad)
    with pytest.raises(ValueError):
        conv.export("pdf")


def test_fork_while_the_parent_has_blocks_in_ram_and_on_disk(tmp_path):
    # Without the wide recovery's overdraft: its extra blocks put this 135M model on a near-tie at the question, and
    # slot 0's K/V differ from slot 1's in the last bits (slot 0's context also holds the prefixes), which tips it.
    # The fork's claim is about memory (same blocks, same states), which the overdraft does not change.
    # 4 MiB of host RAM holds one or two evicted blocks (a 128-token block's K/V is 2.9 MB on this model); the rest
    # spill to disk, whichever blocks the recovery signal brings back.
    settings = Settings(home=str(tmp_path), budget_tokens=320, n_ctx=4096, slots=2, ram_budget_bytes=4 << 20,
                        recovery_overdraft_tokens=0)
    document = "\n".join(f"Entry {i}: the service on port {9000 + i} writes its log to /var/log/s{i}.log."
                         for i in range(40)) + "\nThe passkey is 5821.\n"
    with Engine(settings, scheduler=False, prewarm=False) as engine:
        parent = engine.new_conversation(system_prompt="You are a concise assistant.", tools=[])
        parent.send("Read this file.", attachments=[("services.txt", document)], max_tokens=3, temperature=0)
        for text in TURNS:
            parent.send(text, max_tokens=16, temperature=0)
        states = {b["state"] for b in parent.stats().blocks}
        assert {"ram", "disk"} <= states, states                    # evicted blocks sit in the pool
        child = parent.fork(len(parent.messages()) - 1)
        assert {b["state"] for b in child.stats().blocks} == states
        child.check()
        question = "What is the passkey in services.txt?"
        assert child.send(question, **GREEDY) == parent.send(question, **GREEDY)   # same memory, same answer
        parent.check()
        child.check()
        engine.delete_conversation(child.id)                        # the parent's saved bytes outlive it
        parent.send("And the port of entry 3?", **GREEDY)
        parent.check()


def test_both_branches_reopen_after_a_restart(tmp_path):
    settings = Settings(home=str(tmp_path), budget_tokens=2048, n_ctx=8192, slots=2)
    with Engine(settings, scheduler=False, prewarm=False) as engine:
        parent = chat(engine)
        child = parent.fork(3)
        child.send("And what is the smallest planet?", max_tokens=10, temperature=0)
        # The reply each branch gives without a restart: asked of an exact copy (a fork at its last message).
        expected = {c.id: c.fork(len(c.messages()) - 1).send(PROBE, **GREEDY) for c in (parent, child)}
    events = []
    with Engine(settings, scheduler=False, prewarm=False) as engine:
        engine.subscribe(events.append)
        for conversation_id, reply in expected.items():
            conv = engine.open_conversation(conversation_id)
            assert conv.send(PROBE, **GREEDY) == reply
    restored = {e.conversation_id for e in events if e.kind == "kv_restored"}
    assert restored == set(expected)                                 # from their files, not re-prefilled
