"""Switching the embedder with conversations saved to disk: all reopen from their KV files (no re-prefill),
their vectors are recomputed with the new embedder, and their replies are unchanged."""

from __future__ import annotations

import pytest
from helpers.fuzz_snapshots import clone_conversation, join, split

from evoke_engine import Engine, Settings

QUESTION = "What does node 5 hold?"


@pytest.fixture(scope="module")
def wide_embedder(tmp_path_factory):
    """A second local embedder of another dimension: the bundled MiniLM followed by a 384 -> 768 layer."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense

    from evoke_engine.memory.embedder import bundled_model_path

    torch.manual_seed(0)
    base = SentenceTransformer(bundled_model_path(), device="cpu")
    dense = Dense(in_features=384, out_features=768, activation_function=torch.nn.Identity())
    path = tmp_path_factory.mktemp("wide-embedder") / "wide-768"
    SentenceTransformer(modules=[*base, dense], device="cpu").save(str(path))
    return str(path)


def _ask(engine: Engine, source: str, payload: bytes) -> tuple[str, list[str]]:
    """Reply to QUESTION from a copy of `source` whose KV file is `payload` (the copy is deleted after)."""
    target = clone_conversation(engine, source)
    head, body = split(payload)
    head["conversation_id"] = target
    engine.kvfiles.write(target, "long", join(head, body))
    events: list = []
    engine.subscribe(lambda e: events.append(e) if e.conversation_id == target else None)
    try:
        reply = engine.open_conversation(target).send(QUESTION, max_tokens=4, temperature=0)
    finally:
        engine.delete_conversation(target)
    return reply, [f"{e.kind}: {e.message}" for e in events]


def test_three_saved_conversations_reopen_after_an_embedder_switch(tmp_path, wide_embedder):
    config = Settings(home=str(tmp_path), budget_tokens=320, n_ctx=4096, slots=2, recovery_top_k=0,
                      block_tokens=64)
    with Engine(config, scheduler=False, prewarm=False) as engine:
        ids = []
        for n in range(3):
            doc = "\n".join(f"Entry {i}: the cache at node {i} holds {i * (n + 2)} pages." for i in range(24))
            conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
            conv.send("Read this.", [(f"d{n}.txt", doc)], max_tokens=6, temperature=0)
            engine.release_conversation(conv.id)
            ids.append(conv.id)
        payloads = {cid: bytes(engine.kvfiles.read(cid)) for cid in ids}
        before = {cid: _ask(engine, cid, payloads[cid])[0] for cid in ids}

        assert engine.apply_settings(config.replace(embedder=wide_embedder)) == []     # applies now
        for cid in ids:
            reply, events = _ask(engine, cid, payloads[cid])
            restored = [e for e in events if e.startswith("kv_restored")]
            assert restored and not any(e.startswith("kv_rebuilt") for e in events), events
            assert "recomputed with" in restored[0]
            assert reply == before[cid]

        conv = engine.open_conversation(ids[0])                    # the vectors now come from the new embedder

        assert conv.vector_dims() == ({768}, 768)
        assert conv.send(QUESTION, max_tokens=4, temperature=0) == before[ids[0]]
