"""The Engine on the real embedded model: budget invariant, chunked messages, streaming, cancel, errors."""

from __future__ import annotations

import threading

import pytest

from evoke_engine import BudgetError, Engine, ModelLoadError, Settings

QUESTIONS = ["What is 2 plus 2?", "Name a primary color.", "What is the capital of Italy?",
             "Give one word for happy.", "What do cows drink?", "Say hello in French."]


def long_document(lines: int) -> str:
    return "\n".join(f"Line {i}: the service at port {8000 + i} restarts nightly and logs to file {i}.log."
                     for i in range(lines))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    settings = Settings(home=str(tmp_path_factory.mktemp("engine")), budget_tokens=320, n_ctx=4096, slots=2)
    with Engine(settings, prewarm=False) as eng:
        yield eng


def test_thirty_turns_stay_inside_the_budget(engine):
    conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
    for turn in range(30):
        if turn % 10 == 3:
            conv.send("Read this.", attachments=[(f"log{turn}.txt", long_document(12))], max_tokens=8,
                      temperature=0)
        else:
            conv.send(QUESTIONS[turn % len(QUESTIONS)], max_tokens=24, temperature=0)
        stats = conv.stats()
        assert stats.active_tokens <= stats.budget_tokens, f"turn {turn}: {stats.active_tokens}"
        conv.check()
    stats = conv.stats()
    assert stats.evictions > 0 and stats.max_active_at_turn_end <= 320
    states = {b["state"] for b in stats.blocks}
    assert "resident" in states and "ram" in states


def test_message_larger_than_the_budget_is_decoded_in_chunks_not_truncated(engine):
    conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
    document = long_document(60)                                   # ~1.5K tokens against a 320 budget
    reply = conv.submit("Summarise.", attachments=[("big.txt", document)], max_tokens=12, temperature=0).result()
    stats = conv.stats()
    file_blocks = [b for b in stats.blocks if b["name"].startswith("file:big.txt#")]
    assert reply.prefill_tokens > 1000
    assert sum(b["tokens"] for b in file_blocks) >= reply.prefill_tokens - 40
    assert [b["name"] for b in file_blocks] == [f"file:big.txt#{i}" for i in range(len(file_blocks))]
    assert stats.evictions >= len(file_blocks) - 3
    assert stats.active_tokens <= 320
    conv.check()


def test_streaming_matches_send_and_stop_strings_work(engine):
    a = engine.new_conversation(system_prompt="You are brief.", tools=[])
    b = engine.new_conversation(system_prompt="You are brief.", tools=[])
    streamed = "".join(a.stream("Count from one to five in words.", max_tokens=20, temperature=0))
    sent = b.send("Count from one to five in words.", max_tokens=20, temperature=0)
    assert streamed == sent and streamed
    c = engine.new_conversation(system_prompt="You are brief.", tools=[])
    words = sent.split()
    stopped = c.submit("Count from one to five in words.", max_tokens=20, temperature=0, stop=[words[1]]).result()
    assert stopped.stopped == "stop" and words[1] not in stopped.text


def test_cancel_from_another_thread_keeps_the_partial_reply(engine):
    conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
    pieces: list[str] = []
    started = threading.Event()

    def on_token(piece: str) -> None:
        pieces.append(piece)
        if len(pieces) == 3:
            started.set()

    future = conv.submit("Write a long story about a dragon.", on_token=on_token, max_tokens=200, temperature=0)
    assert started.wait(60)
    conv.cancel()
    reply = future.result()
    assert reply.stopped == "cancelled" and 3 <= reply.n_tokens < 200
    assert reply.text == "".join(pieces)
    assert conv.messages()[-1]["text"] == reply.text                 # the partial reply is kept
    conv.check()


def test_budget_change_applies_at_once(engine):
    conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
    conv.send("Read this.", attachments=[("a.txt", long_document(8))], max_tokens=8, temperature=0)
    before = conv.stats().active_tokens
    conv.set_budget(170)                                 # the smallest that works here is 161
    after = conv.stats()
    assert after.active_tokens <= 170 < before and after.evictions > 0
    with pytest.raises(BudgetError):
        conv.set_budget(5)
    conv.check()


def test_budget_smaller_than_the_prefix_is_refused(engine):
    with pytest.raises(BudgetError, match="system prompt"):
        engine.new_conversation(system_prompt="word " * 400, tools=[])


def test_missing_and_non_gguf_model_files_are_clear_errors(tmp_path):
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(ModelLoadError, match="not found"):
        Engine(Settings(home=str(tmp_path), model_path=str(tmp_path / "nope.gguf")))
    leaked = [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert leaked == []                     # the failed engine stopped its scheduler and its thread
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        Engine(Settings(home=str(tmp_path), model_path=str(fake)))
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ModelLoadError):
        Engine(Settings(home=str(tmp_path), model_path=str(truncated)))


def test_recovery_brings_back_a_needed_document_block(engine):
    """The passkey's block is evicted by filler turns and spliced back for the probe.

    Whether the 135M model then reads the digits right is its own quality, measured by
    `bench recall`; the splice itself is shown to carry the answer in test_engine_kv.
    """
    from benchmarks.recall import run_one

    result = run_one(engine, seed=2, fillers=4)
    assert result["evictions"] > 0 and result["recoveries"] > 0
    assert result["key_block_resident_at_probe"]
    assert "passkey" in result["reply"].lower()


def _evict_document(engine, name: str):
    conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
    doc = long_document(10).replace("restarts", "reboots")
    conv.send("Keep this.", attachments=[(name, doc)], max_tokens=6, temperature=0)
    for question in QUESTIONS[:4]:
        conv.send(question, attachments=[("filler.txt", long_document(6))], max_tokens=8, temperature=0)
    blocks = {b["name"]: b["state"] for b in conv.stats().blocks}
    assert blocks[f"file:{name}#0"] == "ram"
    return conv, doc


def test_a_file_named_in_the_message_is_recovered(engine):
    conv, _ = _evict_document(engine, "settings.py")
    before = conv.stats().recoveries
    conv.send("What does settings.py say about port 8003?", max_tokens=8, temperature=0)
    stats = conv.stats()
    assert stats.recoveries > before
    assert any("settings.py" in e["message"] and "named" in e["message"] for e in stats.events)
    conv.check()


def test_reattached_content_comes_back_by_identity_instead_of_a_prefill(engine):
    conv, doc = _evict_document(engine, "same.txt")
    reply = conv.submit("Here it is again.", attachments=[("same.txt", doc)], max_tokens=6, temperature=0).result()
    stats = conv.stats()
    assert stats.identity_hits >= 1
    assert reply.prefill_tokens < sum(b["tokens"] for b in stats.blocks if b["name"].startswith("file:same.txt#"))
    conv.check()


def test_pinned_blocks_are_never_evicted(engine):
    conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
    conv.send("Keep this.", attachments=[("keep.txt", long_document(6))], max_tokens=6, temperature=0)
    conv.pin_block("file:keep.txt#0")
    for question in QUESTIONS[:4]:
        conv.send(question, attachments=[("filler.txt", long_document(6))], max_tokens=8, temperature=0)
    blocks = {b["name"]: b for b in conv.stats().blocks}
    assert blocks["file:keep.txt#0"]["state"] == "resident" and blocks["file:keep.txt#0"]["pinned"]
    assert conv.stats().evictions > 0
