"""Issue 41, items 5 and 7 on the engine and the real embedded model: a reply continued where it stopped (the same
row grows), another version of a message made current with the messages that followed it (its branch), and a
reply's text edited. After each change the KV is checked against llama.cpp and a clean rebuild of the same history
answers a probe as the changed conversation does."""

from __future__ import annotations

import pytest

from evoke_engine import EditError, Engine, Settings
from evoke_engine.store.history import BRANCH_OF, INTERRUPTED, LIVE, SUPERSEDED, HistoryDB

GREEDY = {"temperature": 0.0}
PROBE = "Say one word."


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    settings = Settings(home=str(tmp_path_factory.mktemp("branches")), budget_tokens=2048, n_ctx=8192, slots=4,
                        embedder="off", tools_enabled=False)
    with Engine(settings, scheduler=False, prewarm=False) as eng:
        yield eng


def chat(engine, turns, max_tokens=8):
    conv = engine.new_conversation(system_prompt="You are a concise assistant.")
    for text in turns:
        conv.send(text, max_tokens=max_tokens, **GREEDY)
    return conv


def texts(conv) -> list[tuple[str, str]]:
    return [(m["role"], m["text"]) for m in conv.messages()]


def kv_agrees(engine, conv, *, same_answer: bool = True) -> None:
    """The KV mirrors llama.cpp, holds the live history in the blocks a clean rebuild of it holds, and (with
    `same_answer`) answers as that rebuild does. A reply that grew live was decoded token by token as it was
    sampled and a rebuild decodes it in one batch, whose rounding can flip a close greedy choice: where the test's
    last reply grew live, the blocks are compared and the probe is only answered."""
    conv.check()
    assert [(m["role"], m["content"].strip()) for m in conv.template_history()] == \
        [(r, t.strip()) for r, t in texts(conv)]
    clone = engine.import_conversation(conv.export("json"))
    try:
        assert [(b["name"], b["tokens"], b["text"]) for b in conv.blocks(with_text=True)] == \
            [(b["name"], b["tokens"], b["text"]) for b in clone.blocks(with_text=True)]
        expected = clone.send(PROBE, max_tokens=6, **GREEDY)
    finally:
        engine.delete_conversation(clone.id)
    answer = conv.send(PROBE, max_tokens=6, **GREEDY)
    assert answer == expected if same_answer else answer.strip()
    conv.check()


# -- the store's branch marks (plain SQLite) ------------------------------------------------------------
def test_hidden_rows_carry_their_branch_and_lose_it_when_they_come_back(tmp_path):
    with HistoryDB(tmp_path / "h.sqlite3") as history:
        history.create_conversation("c", "t", "")
        ids = [history.add_message("c", role, role) for role in ("user", "assistant", "user", "assistant")]
        history.hide_messages("c", ids[2:3], SUPERSEDED)
        history.hide_messages("c", ids[3:], SUPERSEDED, branch_of=ids[2])
        rows = history.messages("c", include_hidden=True)
        assert [r.branch_of for r in rows] == [None, None, None, ids[2]]
        history.restore_messages("c", ids[2:])
        rows = history.messages("c")
        assert [r.status for r in rows] == [LIVE] * 4 and all(BRANCH_OF not in r.extra for r in rows)


# -- item 5: continue generating ------------------------------------------------------------------------
def test_a_reply_cut_at_max_tokens_continues_in_the_same_message(engine):
    question = "List the days of the week, one per line."
    whole = chat(engine, [question], max_tokens=24).messages()[-1]["text"]
    conv = chat(engine, [question], max_tokens=10)
    cut = conv.messages()[-1]
    assert cut["extra"]["metrics"]["stopped"] == "max_tokens"
    pieces = []
    reply = conv.continue_reply(max_tokens=14, on_token=pieces.append, **GREEDY).result()
    after = conv.messages()
    assert len(after) == 2 and after[-1]["id"] == cut["id"]               # the same message grew
    assert reply.text.startswith(cut["text"]) and len(reply.text) > len(cut["text"])
    assert after[-1]["text"] == reply.text and "".join(pieces) == reply.text[len(cut["text"]):]
    assert reply.text == whole                                            # greedy: as if never cut
    metrics = after[-1]["extra"]["metrics"]
    assert not after[-1]["interrupted"] and metrics["tokens"] == reply.n_tokens > 10
    assert 0 < reply.resumed_tokens < reply.n_tokens
    assert reply.prefill_tokens == 1                                      # it grew in its own cells (item 16)
    kv_agrees(engine, conv, same_answer=False)


def test_an_edited_reply_continues_from_its_new_text(engine):
    conv = chat(engine, ["List the days of the week, one per line."], max_tokens=10)
    conv.edit_reply(1, "Monday\nTuesday\nWed")
    reply = conv.continue_reply(max_tokens=6, **GREEDY).result()
    assert reply.text.startswith("Monday\nTuesday\nWed") and reply.n_tokens > reply.resumed_tokens
    assert conv.messages()[-1]["text"] == reply.text
    kv_agrees(engine, conv, same_answer=False)


def test_a_reply_interrupted_by_a_crash_continues_after_the_restart(engine):
    conv = engine.new_conversation(system_prompt="You are a concise assistant.")
    engine.release_conversation(conv.id, persist=False)                 # as after a kill -9: no KV in memory
    engine.history.add_message(conv.id, "user", "Name three colors.")
    row = engine.history.add_message(conv.id, "assistant", "Red,", extra={INTERRUPTED: True})
    assert conv.messages()[-1]["interrupted"]
    reply = conv.continue_reply(max_tokens=8, **GREEDY).result()
    last = conv.messages()[-1]
    assert last["id"] == row and last["text"] == reply.text and reply.text.startswith("Red,")
    assert not last["interrupted"] and len(conv.messages()) == 2
    kv_agrees(engine, conv, same_answer=False)                           # the continuation grew live


def test_only_a_reply_continues_and_a_stopped_continuation_keeps_what_it_wrote(engine):
    conv = engine.new_conversation(system_prompt="You are a concise assistant.")
    with pytest.raises(EditError):
        conv.continue_reply(max_tokens=4).result()
    conv = chat(engine, ["List the days of the week, one per line."], max_tokens=6)
    cut = conv.messages()[-1]
    pieces = []

    def stop_after_one(piece: str) -> None:
        pieces.append(piece)
        conv.cancel()
    reply = conv.continue_reply(max_tokens=12, on_token=stop_after_one, **GREEDY).result()
    assert reply.stopped == "cancelled" and reply.text == cut["text"] + "".join(pieces) and len(pieces) == 1
    last = conv.messages()[-1]
    assert last["id"] == cut["id"] and last["text"] == reply.text
    assert last["extra"]["metrics"]["stopped"] == "cancelled"
    kv_agrees(engine, conv, same_answer=False)


# -- item 7: versions and branches ----------------------------------------------------------------------
def test_an_earlier_reply_version_becomes_current_and_the_next_turn_builds_on_it(engine):
    conv = chat(engine, ["Name a fruit."])
    first = conv.messages()[-1]
    conv.regenerate(temperature=1.0, seed=5, max_tokens=8).result()
    second = conv.messages()[-1]
    assert second["text"] != first["text"]
    assert conv.switch_version(first["id"]) == 1
    assert conv.messages()[-1]["id"] == first["id"]
    versions = conv.versions()[first["id"]]
    assert [v["id"] for v in versions] == [first["id"], second["id"]]
    assert [v["status"] for v in versions] == [LIVE, SUPERSEDED]
    kv_agrees(engine, conv)                                               # the probe turn builds on version 1
    assert conv.template_history()[1]["content"].strip() == first["text"].strip()


def test_after_an_edit_the_old_branch_comes_back_whole_and_goes_again(engine):
    conv = chat(engine, ["Name a color of the sky.", "Name an animal."])
    old = conv.messages()
    conv.edit(0, "Name a color of grass.", max_tokens=8, **GREEDY).result()
    new = conv.messages()
    assert len(new) == 2 and new[0]["text"] == "Name a color of grass."
    assert [v["id"] for v in conv.versions()[new[0]["id"]]] == [old[0]["id"], new[0]["id"]]
    assert conv.switch_version(old[0]["id"]) == 0
    assert [m["id"] for m in conv.messages()] == [m["id"] for m in old]     # the whole old branch, as it was
    kv_agrees(engine, conv)
    branch = conv.messages()                                              # the probe turn joined this branch
    conv.switch_version(new[0]["id"])
    assert [m["id"] for m in conv.messages()] == [m["id"] for m in new]
    kv_agrees(engine, conv)
    conv.switch_version(old[0]["id"])
    assert [m["id"] for m in conv.messages()] == [m["id"] for m in branch]
    with pytest.raises(EditError):
        conv.switch_version(10**9)


def test_an_edited_reply_replaces_its_text_and_the_kv_is_rebuilt_from_it(engine):
    conv = chat(engine, ["Name a color of the sky.", "Name an animal."])
    old = conv.messages()
    new_id = conv.edit_reply(1, "Blue, like the sea.")
    after = conv.messages()
    assert [m["text"] for m in after] == [old[0]["text"], "Blue, like the sea."] and after[1]["id"] == new_id
    assert [v["id"] for v in conv.versions()[new_id]] == [old[1]["id"], new_id]
    kv_agrees(engine, conv)
    conv.switch_version(old[1]["id"])                                     # the original reply and what followed
    assert [m["id"] for m in conv.messages()] == [m["id"] for m in old]
    kv_agrees(engine, conv)
    with pytest.raises(EditError):
        conv.edit_reply(0, "a user message is edited with edit()")
