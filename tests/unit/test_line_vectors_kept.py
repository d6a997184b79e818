"""Line vectors off the critical path (issue 44): a block's line vectors are embedded at a turn end, kept in the
KV file (format 5) and adopted on a reopen, so the first turn after it embeds only the new message; an older file
still opens (its lines come at the next turn end); an embedder warming up leaves the turn to the lexical signal."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from helpers.rig import Rig
from helpers.word_embedder import CountingEmbedder

from evoke_engine.kvcache.blocks import BlockState
from evoke_engine.memory.memory import ConversationMemory
from evoke_engine.memory.recall_signals import line_key
from evoke_engine.memory.snapshot import decode_payload, encode_payload

pytestmark = pytest.mark.unit

HISTORY = [{"role": "user", "content": "x", "evoke_turn": 1}]
QUESTION = "which value does file_1.2.3 hold?"


@pytest.fixture
def rig(tmp_path):
    rig = Rig(tmp_path, recall_signal="lines", recovery_top_k=2)
    yield rig
    rig.close()


def _saved_conversation(rig: Rig) -> tuple[bytes, list]:
    """A conversation with evicted blocks, its lines embedded at the turn end, written as a KV file's payload."""
    memory = rig.memory()
    memory.embedder = CountingEmbedder()
    blocks = [rig.add(memory, "file", 16, priority=p) for p in (0.1, 0.1, 0.9, 0.9, 0.9, 0.9)]
    memory.end_turn()
    memory.evict_to(memory.active_tokens - 20)
    assert [b.state for b in blocks[:2]] == [BlockState.RAM] * 2
    memory.park()
    payload = encode_payload(memory.snapshot("prefix", HISTORY))
    memory.release()
    return payload, blocks


def _reopen(rig: Rig, payload: bytes, embedder: CountingEmbedder) -> ConversationMemory:
    """A fresh process's open: a new embedder object (an empty cache), the file loaded, the slot entered."""
    loaded = ConversationMemory("c2", settings=rig.settings, runtime=rig.rt, kv=rig.kv, pool=rig.pool,
                                embedder=embedder, emit=rig.events.append)
    loaded.load_snapshot(decode_payload(payload), rig.prefix_tokens)
    rig.enter_slot(loaded, 1)
    loaded.turn += 1
    loaded.set_query(QUESTION)
    return loaded


def _as_format_4(payload: bytes) -> bytes:
    """The same payload as a build before line vectors wrote it."""
    (head_len,) = struct.unpack_from("<I", payload, 0)
    head = json.loads(payload[4:4 + head_len])
    head["format"] = 4
    del head["line_vectors"]
    raw = json.dumps(head, separators=(",", ":")).encode()
    return struct.pack("<I", len(raw)) + raw + payload[4 + head_len:]


def test_the_first_turn_after_a_reopen_embeds_only_the_new_message(rig):
    payload, _ = _saved_conversation(rig)
    embedder = CountingEmbedder()
    loaded = _reopen(rig, payload, embedder)
    loaded.recover(QUESTION, message_tokens=16, reply_reserve=16)
    assert embedder.texts == [QUESTION]
    assert loaded.last_embed_s >= 0.0 and loaded.last_decide_s > 0.0


def test_line_vectors_round_trip_through_the_kv_file(rig):
    payload, blocks = _saved_conversation(rig)
    lines = decode_payload(payload).lines
    reference = CountingEmbedder()
    for block in blocks:
        key = line_key(block, rig.settings.recall_file_name_line, rig.settings.recall_skip_questions)
        texts, vectors = lines[key]
        assert texts and vectors.shape == (len(texts), 64) and vectors.dtype == np.float32
        expected = np.stack([reference._vector(t) for t in texts])
        assert np.allclose(vectors, expected, atol=2e-3)               # float16 on disk


def test_an_older_file_opens_and_embeds_its_lines_on_idle_time_after_the_turn(rig):
    payload, blocks = _saved_conversation(rig)
    old = _as_format_4(payload)
    assert decode_payload(old).lines == {}
    embedder = CountingEmbedder()
    loaded = _reopen(rig, old, embedder)
    loaded.recover(QUESTION, message_tokens=16, reply_reserve=16)
    assert embedder.texts == [QUESTION]                    # the decision waits for no line vector
    loaded.end_turn()
    assert embedder.texts == [QUESTION]                    # the reply's end waits for no embedding either
    loaded.embed_due()                                     # the engine's idle time after the turn
    assert len(embedder.texts) > 1                         # every block's lines, saved ones too
    loaded.embed_due()
    assert embedder.texts.count(QUESTION) == 1 and len(set(embedder.texts)) == len(embedder.texts)   # once
    loaded.park()
    again = CountingEmbedder()
    reopened = _reopen(rig, encode_payload(loaded.snapshot("prefix", HISTORY)), again)
    reopened.recover(QUESTION, message_tokens=16, reply_reserve=16)
    assert again.texts == [QUESTION]


def test_a_warming_embedder_leaves_the_decision_to_the_lexical_signal_and_says_so(rig):
    payload, blocks = _saved_conversation(rig)
    embedder = CountingEmbedder()
    embedder.warming = True
    loaded = _reopen(rig, payload, embedder)
    recovered = loaded.recover(blocks[1].text.split()[3], message_tokens=16, reply_reserve=16)
    assert embedder.texts == []
    assert recovered and all(d["signal"] == "lexical" and "embedder_warming" in d for d in loaded.decisions)
