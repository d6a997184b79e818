"""A reply after evictions and recoveries is the reply to a fresh prefill of the tokens the engine held, but for near
ties (NEAR_TIE, checked step by step): the context built by saving, compacting, re-anchoring and splicing reads as
llama.cpp would read the same tokens decoded in order.

The passkey conversation of `bench recall` at a 512-token budget (evictions, similarity recoveries, the best match
moved next to the question); the reference is llama-cpp-python's own `Llama` on the embedded model, greedy. Seed 1 is
one the 135M model misreads (6789 for 6788): the splice is not why, a prefill of the same tokens misreads alike.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from benchmarks import recall
from benchmarks.conversations import comparator_llama
from evoke_engine import Engine, Settings
from evoke_engine.memory.memory import ConversationMemory

pytestmark = pytest.mark.slow
# Two tokens whose logits a prefill puts this close are a coin toss for any numerical path (f16 K/V, the K-shift's
# rounding); a real misplacement costs far more (a block spliced into the wrong cells: 0.57 in test_chunk_reuse).
NEAR_TIE = 0.1
# Short of where the engine's stop strings may end a reply (the reference decodes on, plain greedy), hence the
# conversation written out here rather than `recall.run_one`, whose probe runs to 24 tokens.
REPLY_TOKENS = 16


@pytest.fixture(scope="module")
def reference():
    return comparator_llama(n_ctx=4096, n_threads=2, logits_all=True)


def greedy_steps_missed(llm, tokens: list[int], reply: str, n: int) -> list[str]:
    """The steps of `reply` (after `tokens`, up to `n` tokens, then its end) where a prefill of `tokens` would
    have chosen otherwise by at least NEAR_TIE logits: none when the reply is the prefill's greedy reply, but for
    near ties."""
    llm.reset()
    llm.eval(tokens)
    steps = llm.tokenize(reply.encode(), add_bos=False, special=False)[:n]
    ends = [llm.token_eos()] if len(steps) < n else []          # it stopped: the prefill must stop there too
    missed = []
    for at, token in enumerate([*steps, *ends]):
        scores = llm.scores[llm.n_tokens - 1]
        best = int(np.argmax(scores))
        if best != token and scores[best] - scores[token] >= NEAR_TIE:
            missed.append(f"step {at}: {llm.detokenize([token])!r} where a prefill says {llm.detokenize([best])!r} "
                          f"by {scores[best] - scores[token]:.3f}")
        if token != llm.token_eos():
            llm.eval([token])
    return missed


@pytest.mark.parametrize("seed", [1, 2])
def test_a_reply_after_recoveries_is_the_reply_to_a_prefill_of_its_context(seed, reference, tmp_path, monkeypatch):
    held: dict = {}
    reply_starts = ConversationMemory.reply_starts

    def note_context(memory: ConversationMemory) -> None:      # what the reply reads, as it starts
        resident = sorted(memory.table.resident, key=lambda b: b.pos)
        held["spans"] = [(b.pos, b.n_tokens) for b in resident]
        held["tokens"] = [t for b in resident for t in b.tokens] + memory.sequence.kv.held_ahead(memory.seq)
        reply_starts(memory)

    monkeypatch.setattr(ConversationMemory, "reply_starts", note_context)
    rng = random.Random(seed)
    document, passkey, _ = recall.make_document(rng)
    settings = Settings(home=str(tmp_path), budget_tokens=512, recovery="kv_restore", n_ctx=8192, slots=2)
    with Engine(settings, prewarm=False) as engine:
        conv = engine.new_conversation(system_prompt=recall.SYSTEM, tools=[])
        conv.send("Please read this document and reply OK.", attachments=[("document.txt", document)],
                  max_tokens=3, temperature=0)
        for question in rng.sample(recall.FILLERS, 6):
            conv.send(question, max_tokens=80, temperature=0)
        reply = conv.send(recall.PROBE, max_tokens=REPLY_TOKENS, temperature=0)
        stats = conv.stats()
    assert stats.evictions > 0 and stats.recoveries > 0, "the conversation never left the budget: nothing tested"
    spans = held["spans"]
    assert spans[0][0] == 0 and all(p + n == q for (p, n), (q, _) in zip(spans, spans[1:], strict=False))
    assert greedy_steps_missed(reference, held["tokens"], reply, REPLY_TOKENS) == []
