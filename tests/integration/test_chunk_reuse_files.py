"""Chunk reuse from KV files on the real embedded model: a conversation closed (its KV file written), or closed by an
engine restart, still lends its file's blocks to a new conversation with the same system prompt, spliced from the
file (where == "file") with the first-token logits of decoding them; a file changed, damaged or deleted after it was
indexed is not used (the blocks are decoded, nothing half-applied)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from evoke_engine import Engine, Settings
from evoke_engine.events import EventKind
from evoke_engine.memory.snapshot import decode_payload, encode_payload

FILE = "\n".join(f"def handler_{i}(request):\n    # route {i} answers on port {8000 + i}\n"
                 f"    return respond(request, code={200 + i % 5}, cache_seconds={i * 7 % 60})\n"
                 for i in range(24))
ATTACHMENT = [("handlers.py", FILE)]
PROBE = "Which port does handler_3 answer on?"


def settings(home) -> Settings:
    return Settings(home=str(home), n_ctx=16384, slots=4, budget_tokens=3072, temperature=0.0, embedder="off")


def first_logits(engine: Engine, into: list[np.ndarray]):
    """An `on_token` that copies the logits the first token was sampled from (engine thread, before any decode)."""
    def on_token(_piece: str) -> None:
        if not into:
            into.append(engine.diagnostics().rt.logits())
    return on_token


def closed_with_the_file(engine: Engine) -> tuple[str, list[dict]]:
    """A conversation that read the file, then was closed (its KV file written, its slot and pool bytes freed)."""
    first = engine.new_conversation()
    first.submit("Keep this file in mind.", ATTACHMENT, max_tokens=4).result()
    file_blocks = [b for b in first.stats().blocks if b["role"] == "file"]
    assert len(file_blocks) >= 3
    engine.release_conversation(first.id)
    assert engine.kvfiles.has(first.id)
    return first.id, file_blocks


def probe(engine: Engine, events: list) -> tuple[object, np.ndarray, list[dict], object]:
    """A new conversation asks about the attached file: its reply, first-token logits and reuse records."""
    logits: list[np.ndarray] = []
    conv = engine.new_conversation()
    reply = conv.submit(PROBE, ATTACHMENT, max_tokens=24, on_token=first_logits(engine, logits)).result()
    conv.check()
    hits = [r for e in events if e.kind is EventKind.BLOCKS_REUSED and e.conversation_id == conv.id
            for r in e.detail["blocks"]]
    return reply, logits[0], hits, conv


def decoded_reference(engine: Engine) -> tuple[object, np.ndarray]:
    """The same question with chunk reuse off: every block decoded."""
    engine.apply_settings(dataclasses.replace(engine.settings, chunk_reuse=False))
    try:
        reply, logits, hits, _ = probe(engine, [])
    finally:
        engine.apply_settings(dataclasses.replace(engine.settings, chunk_reuse=True))
    assert reply.reused_tokens == 0 and not hits
    return reply, logits


def assert_spliced_from_file(engine: Engine, events: list, source_id: str, file_blocks: list[dict]) -> None:
    reused, reused_logits, hits, conv = probe(engine, events)
    assert [r["block"] for r in hits] == [b["name"] for b in file_blocks]
    assert all(r["exact"] and r["where"] == "file" and r["from"].startswith(f"{source_id}:") for r in hits)
    file_tokens = sum(b["tokens"] for b in file_blocks)
    assert reused.reused_tokens == file_tokens and reused.prefill_tokens < 60      # only the question decoded
    assert all(b["reused_from"].endswith("(file, exact)") for b in conv.stats().blocks if b["role"] == "file")
    decoded, decoded_logits = decoded_reference(engine)
    assert reused.text == decoded.text
    delta = float(np.abs(reused_logits - decoded_logits).max())
    print("max |delta logit| spliced from the KV file vs decoded:", delta)
    assert delta == 0.0


def test_a_closed_conversation_lends_its_file_blocks_from_its_kv_file(tmp_path):
    with Engine(settings(tmp_path), prewarm=False, scheduler=False) as engine:
        events: list = []
        engine.subscribe(events.append)
        source_id, file_blocks = closed_with_the_file(engine)
        assert_spliced_from_file(engine, events, source_id, file_blocks)


def test_after_a_restart_the_kv_files_are_found_again(tmp_path):
    with Engine(settings(tmp_path), prewarm=False, scheduler=False) as engine:
        source_id, file_blocks = closed_with_the_file(engine)
    with Engine(settings(tmp_path), prewarm=False, scheduler=False) as engine:
        events: list = []
        engine.subscribe(events.append)
        engine.thread.call(engine.ensure_model)
        assert engine.thread.call(lambda: engine.model.chunks.file_entries()) >= len(file_blocks)
        assert_spliced_from_file(engine, events, source_id, file_blocks)
        assert engine.thread.call(lambda: engine.model.chunks.files.reads) == 1      # one verified read of it


def _other_tokens(payload) -> bytes:
    """The same snapshot with its file blocks' tokens changed (and their hashes made to fit): the head still
    records their old chains, which its tokens no longer give."""
    snapshot = decode_payload(bytearray(payload))
    for block in snapshot.blocks:
        if block.role == "file":
            block.tokens = [t + 1 for t in block.tokens]
            block.hash = ""
            block.__post_init__()
    return encode_payload(snapshot)


@pytest.mark.parametrize("change", ["deleted", "other tokens", "damaged"])
def test_a_kv_file_changed_after_it_was_indexed_is_not_used(tmp_path, change):
    with Engine(settings(tmp_path), prewarm=False, scheduler=False) as engine:
        events: list = []
        engine.subscribe(events.append)
        source_id, file_blocks = closed_with_the_file(engine)
        store = engine.kvfiles
        if change == "deleted":
            store.remove(source_id)
        elif change == "other tokens":
            store.write(source_id, "long", _other_tokens(store.read(source_id, refresh=False)))
        else:
            path = next(store.directory.glob(f"{source_id}.*.bin"))
            data = bytearray(path.read_bytes())
            data[-100] ^= 0xFF                               # a bit flip in the K/V: the digest no longer fits
            path.write_bytes(bytes(data))
        assert engine.thread.call(lambda: engine.model.chunks.file_entries()) >= len(file_blocks)
        reply, logits, hits, conv = probe(engine, events)
        assert not hits and reply.reused_tokens == 0                   # decoded, not spliced
        assert reply.prefill_tokens > sum(b["tokens"] for b in file_blocks)
        assert engine.thread.call(lambda: engine.model.chunks.file_entries()) == 0   # forgotten
        assert not [e for e in events if e.kind is EventKind.ERROR and e.conversation_id == conv.id]
        decoded, decoded_logits = decoded_reference(engine)
        assert reply.text == decoded.text
        assert float(np.abs(logits - decoded_logits).max()) == 0.0


def test_a_conversation_reopened_from_its_file_lends_from_its_slot_and_its_next_file(tmp_path):
    with Engine(settings(tmp_path), prewarm=False, scheduler=False) as engine:
        source_id, file_blocks = closed_with_the_file(engine)
    with Engine(settings(tmp_path), prewarm=False, scheduler=False) as engine:
        events: list = []
        engine.subscribe(events.append)
        engine.open_conversation(source_id)                              # restored from its KV file
        assert any(e.kind is EventKind.KV_RESTORED and e.conversation_id == source_id for e in events)
        reused, _, hits, _ = probe(engine, events)
        assert [r["where"] for r in hits] == ["slot"] * len(file_blocks)      # its blocks registered again
        assert reused.reused_tokens == sum(b["tokens"] for b in file_blocks)
        engine.release_conversation(source_id)                           # written again: still lends them
        assert engine.thread.call(lambda: engine.model.chunks.files.reads) == 0
        assert engine.thread.call(lambda: engine.model.chunks.file_entries(source_id)) >= len(file_blocks)
