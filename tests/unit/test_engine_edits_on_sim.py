"""Rollback and editing on a whole Engine over the simulated backend (issue 47): a failed turn rolls back, a
cancel keeps the partial reply, truncate (the endpoint's rollback), regenerate, edit, continue, edit_reply,
delete/undelete and fork, each checked on SQLite's live history and token for token on the slot's cells."""

from __future__ import annotations

import pytest
from helpers.sim_backend import SimBackend, conversation_text, rendered, sim_engine, sim_settings, slot_tokens

pytestmark = pytest.mark.unit


@pytest.fixture
def backend(tmp_path):
    return SimBackend(tmp_path / "sim.gguf")


@pytest.fixture
def engine(backend, tmp_path):
    with sim_engine(backend, sim_settings(tmp_path)) as (engine, _):
        yield engine


def texts(conv):
    return [m["text"] for m in conv.messages()]


def test_a_failed_turn_rolls_back_its_message_and_the_kv(engine, backend):
    conv = engine.new_conversation()
    conv.send("kept")
    before, history = slot_tokens(engine, conv.id), texts(conv)
    backend.script(RuntimeError("the sampler broke"))
    with pytest.raises(RuntimeError, match="the sampler broke"):
        conv.send("lost")
    assert texts(conv) == history
    assert slot_tokens(engine, conv.id)[:len(before) - 2] == before[:-2]     # the cells up to the held opening
    assert conversation_text(engine, conv.id).startswith(rendered(engine, conv.id, held_opening=False))
    engine.check(conv.id)
    assert conv.send("next") == "reply 3."                 # the conversation goes on where it was
    assert conversation_text(engine, conv.id) == rendered(engine, conv.id)


def test_a_cancelled_turn_keeps_its_partial_reply(engine, backend):
    conv = engine.new_conversation()
    backend.script("one two three four five six")
    pieces: list[str] = []

    def on_token(piece: str) -> None:
        pieces.append(piece)
        if len(pieces) == 2:
            engine.cancel(conv.id)

    reply = conv.submit("count", on_token=on_token).result(timeout=30)
    assert reply.text == "".join(pieces) and reply.text.startswith("one two") and "six" not in reply.text
    assert texts(conv) == ["count", reply.text]
    assert conversation_text(engine, conv.id) == rendered(engine, conv.id)
    engine.check(conv.id)


def test_truncate_rolls_the_kv_back_to_the_kept_messages(engine):
    conv = engine.new_conversation()
    conv.send("first")
    after_first = slot_tokens(engine, conv.id)
    conv.send("second")
    conv.truncate(2)
    assert texts(conv) == ["first", "reply 1."]
    now = slot_tokens(engine, conv.id)
    assert now == after_first[:len(now)] and len(now) >= len(after_first) - 2
    assert conversation_text(engine, conv.id).startswith(rendered(engine, conv.id, held_opening=False))
    assert conv.send("third") == "reply 3."
    assert conversation_text(engine, conv.id) == rendered(engine, conv.id)


def test_regenerate_samples_the_last_reply_again_without_re_decoding_the_prompt(engine, backend):
    conv = engine.new_conversation()
    backend.script("the first try.", "the second try.")
    conv.send("a question")
    decoded, cells = len(backend.rt.decoded), len(slot_tokens(engine, conv.id))
    old_reply = backend.rt.tokenize("<|im_start|>assistant\nthe first try.<|im_end|>\n<|im_start|>user\n")
    reply = engine.regenerate(conv.id).result(timeout=30)
    assert reply.text == "the second try." and texts(conv) == ["a question", "the second try."]
    slot = engine.diagnostics().slots.slot_of(conv.id)
    starts = [start for seq, start, n in backend.rt.decoded[decoded:] if seq == slot and n]
    assert starts and min(starts) >= cells - len(old_reply), "the prompt before the reply was not decoded again"
    assert [v["text"] for v in conv.versions()[conv.messages()[1]["id"]]] == ["the first try.", "the second try."]
    assert conversation_text(engine, conv.id) == rendered(engine, conv.id)
    engine.check(conv.id)


def test_edit_replaces_a_user_message_and_what_followed(engine, backend):
    conv = engine.new_conversation()
    conv.send("the old question")
    conv.send("a follow-up")
    reply = conv.edit(0, "the new question").result(timeout=30)
    assert texts(conv) == ["the new question", reply.text]
    assert "the old question" not in conversation_text(engine, conv.id)
    assert conversation_text(engine, conv.id) == rendered(engine, conv.id)
    versions = conv.versions()[conv.messages()[0]["id"]]
    assert [v["text"] for v in versions] == ["the old question", "the new question"]
    engine.check(conv.id)


def test_continue_reply_grows_a_reply_cut_at_max_tokens(engine, backend):
    conv = engine.new_conversation()
    backend.script("alpha beta gamma delta", "epsilon zeta")
    cut = conv.send("go on", max_tokens=2)
    assert cut == "alpha beta "
    reply = conv.continue_reply().result(timeout=30)
    assert reply.text == "alpha beta epsilon zeta" and reply.resumed_tokens == 2
    assert texts(conv) == ["go on", "alpha beta epsilon zeta"]
    assert conversation_text(engine, conv.id) == rendered(engine, conv.id)
    engine.check(conv.id)


def test_continue_grows_the_reply_in_its_cells_or_decodes_its_stored_text_again(engine, backend):
    conv = engine.new_conversation()
    backend.script("alpha beta gamma delta", "epsilon zeta", "eta theta iota", "kappa")
    conv.send("go on", max_tokens=2)
    in_place = conv.continue_reply(max_tokens=1).result(timeout=30)
    assert in_place.prefill_tokens == 1                     # only the reply's last token decoded again
    row = conv.messages()[-1]
    engine.history.update_message(conv.id, row["id"], "alpha ")    # the stored text is not what the cells hold
    again = conv.continue_reply(max_tokens=1).result(timeout=30)
    assert again.text.startswith("alpha ") and again.prefill_tokens > 1
    assert conversation_text(engine, conv.id) == rendered(engine, conv.id)
    engine.check(conv.id)


def test_edit_reply_rewrites_a_reply_and_the_kv_from_it(engine):
    conv = engine.new_conversation()
    conv.send("question")
    conv.send("later")
    conv.edit_reply(1, "a better answer.")
    assert texts(conv) == ["question", "a better answer."]
    assert conversation_text(engine, conv.id).startswith(rendered(engine, conv.id, held_opening=False))
    assert conv.send("and now?") == "reply 3."
    assert conversation_text(engine, conv.id) == rendered(engine, conv.id)
    engine.check(conv.id)


def test_a_deleted_message_leaves_the_context_and_undelete_brings_it_back(engine, backend):
    conv = engine.new_conversation()
    conv.send("keep me")
    conv.send("drop me")
    dropped = conv.messages()[2]["id"]
    conv.delete_message(2)
    assert "drop me" not in texts(conv) and "drop me" not in conversation_text(engine, conv.id)
    engine.check(conv.id)
    assert conv.undelete([dropped]) == [dropped]
    assert "drop me" in texts(conv) and "drop me" in conversation_text(engine, conv.id)
    engine.check(conv.id)


def test_a_fork_keeps_the_messages_up_to_its_point_and_leaves_the_parent_alone(engine, backend):
    parent = engine.new_conversation()
    parent.send("shared question")
    parent.send("only the parent's")
    parent_cells = slot_tokens(engine, parent.id)
    child = parent.fork(1)
    assert texts(child) == ["shared question", "reply 1."]
    assert child.send("only the child's") == "reply 3."
    assert conversation_text(engine, child.id) == rendered(engine, child.id)
    assert slot_tokens(engine, parent.id) == parent_cells
    assert texts(parent)[-2:] == ["only the parent's", "reply 2."]
    engine.check(parent.id)
    engine.check(child.id)

