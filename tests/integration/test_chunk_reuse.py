"""Chunk reuse across conversations on the real embedded model: a second conversation with the same system prompt
and the same attached file splices the file's blocks from the first one's slot and continues as decoding them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from evoke_engine import Engine, Settings
from evoke_engine.events import EventKind

FILE = "\n".join(f"def handler_{i}(request):\n    # route {i} answers on port {8000 + i}\n"
                 f"    return respond(request, code={200 + i % 5}, cache_seconds={i * 7 % 60})\n"
                 for i in range(24))
ATTACHMENT = [("handlers.py", FILE)]
PROBE = "Which port does handler_3 answer on?"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    settings = Settings(home=str(tmp_path_factory.mktemp("reuse")), n_ctx=16384, slots=4, budget_tokens=3072,
                        temperature=0.0, embedder="off")
    with Engine(settings, prewarm=False, scheduler=False) as eng:
        yield eng


def first_logits(engine: Engine, into: list[np.ndarray]):
    """An `on_token` that copies the logits the first token was sampled from (engine thread, before any decode)."""
    def on_token(_piece: str) -> None:
        if not into:
            into.append(engine.diagnostics().rt.logits())
    return on_token


def test_a_second_conversation_reuses_the_file_and_continues_as_decoding_it(engine):
    events = []
    engine.subscribe(events.append)
    first = engine.new_conversation()
    first.submit("Keep this file in mind.", ATTACHMENT, max_tokens=4).result()
    file_blocks = [b for b in first.stats().blocks if b["role"] == "file"]
    assert len(file_blocks) >= 3

    reused_logits: list[np.ndarray] = []
    second = engine.new_conversation()
    reused = second.submit(PROBE, ATTACHMENT, max_tokens=24, on_token=first_logits(engine, reused_logits)).result()
    second.check()
    hits = [e for e in events if e.kind is EventKind.BLOCKS_REUSED and e.conversation_id == second.id]
    assert len(hits) == 1
    assert [r["block"] for r in hits[0].detail["blocks"]] == [b["name"] for b in file_blocks]
    assert all(r["exact"] and r["where"] == "slot" for r in hits[0].detail["blocks"])
    file_tokens = sum(b["tokens"] for b in file_blocks)
    assert reused.reused_tokens == file_tokens
    stats = second.stats()
    assert stats.reused_tokens == file_tokens
    assert stats.prefill_tokens == reused.prefill_tokens                        # only the question decoded
    assert reused.prefill_tokens < 60
    assert all(b["reused_from"].startswith(f"{first.id}:") for b in stats.blocks if b["role"] == "file")

    engine.apply_settings(dataclasses.replace(engine.settings, chunk_reuse=False))
    try:
        decoded_logits: list[np.ndarray] = []
        third = engine.new_conversation()
        decoded = third.submit(PROBE, ATTACHMENT, max_tokens=24,
                               on_token=first_logits(engine, decoded_logits)).result()
    finally:
        engine.apply_settings(dataclasses.replace(engine.settings, chunk_reuse=True))
    assert decoded.reused_tokens == 0 and third.stats().prefill_tokens == decoded.prefill_tokens
    assert reused.text == decoded.text                                           # greedy tokens identical
    delta = float(np.abs(reused_logits[0] - decoded_logits[0]).max())
    assert delta == 0.0            # bit-identical: the source decoded these cells as a decode here would


def test_after_a_different_first_message_nothing_is_reused(engine):
    events = []
    engine.subscribe(events.append)
    first = engine.new_conversation()
    first.submit("Keep this file in mind.", ATTACHMENT, max_tokens=4).result()
    other = engine.new_conversation()
    other.submit("Hello there.", max_tokens=4).result()
    reply = other.submit(PROBE, ATTACHMENT, max_tokens=4).result()
    assert reply.reused_tokens == 0
    assert not [e for e in events if e.kind is EventKind.BLOCKS_REUSED and e.conversation_id == other.id]


def test_after_a_different_first_message_the_file_is_reused_approximately_and_repaired(engine):
    events = []
    engine.subscribe(events.append)
    first = engine.new_conversation()
    first.submit("Keep this file in mind.", ATTACHMENT, max_tokens=4).result()
    engine.apply_settings(dataclasses.replace(engine.settings, chunk_reuse_approximate=True,
                                              chunk_reuse_repair_tokens=16))
    try:
        other = engine.new_conversation()
        other.submit("Good morning.", max_tokens=4).result()
        reply = other.submit(PROBE, ATTACHMENT, max_tokens=8).result()
        other.check()
    finally:
        engine.apply_settings(dataclasses.replace(engine.settings, chunk_reuse_approximate=False))
    hits = [e for e in events if e.kind is EventKind.BLOCKS_REUSED and e.conversation_id == other.id]
    assert len(hits) == 1
    blocks = hits[0].detail["blocks"]
    assert not any(r["exact"] for r in blocks)
    files = [r for r in blocks if r["block"].startswith("file:")]        # the question may match an earlier test's
    assert len(files) >= 3 and len({r["from"].split(":")[0] for r in files}) == 1
    assert files[0]["repaired"] == 16 and all(r["repaired"] == 0 for r in files[1:])     # one seam, one repair
    assert reply.reused_tokens == sum(r["tokens"] for r in blocks) > 0
    assert reply.n_tokens > 0
