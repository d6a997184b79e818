"""Issue 46, third part: levers of a wide recovery's working set for facts asked about hours later, on plain blocks.
`recovery_signal_tops`: each recall signal's own best saved blocks join the fused working set (a question in other
words than the fact's line shares no term with it, and the fused rank buried the block the line vectors rank first).
`recovery_questions_last`: when the message asks for a value, the user's earlier questions that only asked rank
after every block that states something. The embedder is a stand-in that maps words to concepts (no model)."""

from __future__ import annotations

import re
import zlib
from types import SimpleNamespace

import numpy as np
import pytest

from evoke_engine.kvcache.blocks import Block, BlockState
from evoke_engine.memory.memory import ConversationMemory
from evoke_engine.memory.recall_signals import RecallSignal, message_asks, only_asks
from evoke_engine.settings import Settings

pytestmark = pytest.mark.unit

# words of one meaning share a dimension: the paraphrase a MiniLM sees, without a model
CONCEPTS = {"crowd": "users", "shoppers": "users", "users": "users", "hammer": "load", "locust": "load",
            "purchase": "checkout", "checkout": "checkout"}


class ConceptEmbedder:
    enabled = True
    identity = "concepts"

    def _vector(self, text: str) -> np.ndarray:
        v = np.zeros(256, dtype=np.float32)
        for word in re.findall(r"[a-z0-9]+", text.lower()):
            v[zlib.crc32(CONCEPTS.get(word, word).encode()) % 256] += 1.0
        return v / (np.linalg.norm(v) or 1.0)

    def embed(self, texts):
        return np.stack([self._vector(t) for t in texts]) if texts else None

    def embed_one(self, text):
        return self._vector(text)


def _block(name: str, text: str, role: str = "user", embedder=None) -> Block:
    b = Block(name=name, role=role, turn=1, tokens=[zlib.crc32(text.encode()) % 1000, len(text)], text=text,
              state=BlockState.RAM)
    if embedder is not None:
        b.embedding = embedder.embed_one(text)
    return b


def test_a_message_that_only_asks_states_nothing():
    assert only_asks(_block("user#3", "Quick one: How long does the proxy wait? Short answer please."))
    assert not only_asks(_block("user#4", "Decision: we cap the export queue at 5207 jobs."))
    assert not only_asks(_block("user#5", "The deploy window is Tuesday now.\nWhere is the runbook for it?"))
    assert not only_asks(_block("assistant#5", "What would you like to change next?", role="assistant"))
    assert message_asks("Remind me: What crowd size did I hammer the purchase flow with?")
    assert not message_asks("Here is the config file, have a look.")


def test_the_line_vectors_own_top_stays_in_reach_when_no_word_is_shared():
    emb = ConceptEmbedder()
    message = "Remind me: What crowd size did I hammer the purchase flow with?"
    fact = _block("user#7", "$ locust -f checkout.py --users 2410 --headless", embedder=emb)
    askers = [_block(f"user#{i}", f"Remind me: {noun} owner?", embedder=emb)
              for i, noun in enumerate(["invoice", "export", "upload", "ledger"], start=10)]
    signal = RecallSignal("fused", query_text=message, query=emb.embed_one(message), saved=[fact, *askers],
                          residents=[], embedder=emb)
    fused = sorted([fact, *askers], key=signal.similarity, reverse=True)
    assert fused.index(fact) > 0                       # the shared asking words win the fused rank
    assert signal.own_tops([fact, *askers], 1)[0] is fact
    lexical_only = RecallSignal("lexical", query_text=message, query=None, saved=[fact, *askers], residents=[],
                                embedder=emb)
    assert fact not in lexical_only.own_tops([fact, *askers], 2)   # no term in common: no lexical top


def _memory(budget: int, query: str = "", **overrides) -> SimpleNamespace:
    memory = SimpleNamespace(settings=Settings(home="/nonexistent-evoke-home", **overrides), budget_tokens=budget,
                             _query_text=query, table=SimpleNamespace(blocks=[]))
    memory.recovery_width = lambda: ConversationMemory.recovery_width(memory)
    return memory


def _ranked(n: int, role: str = "file") -> list[Block]:
    blocks = [Block(name=f"b{i}", role=role, turn=1, tokens=list(range(10)), text=f"line {i} = {i}")
              for i in range(n)]
    for b in blocks:
        b.state = BlockState.RAM
    return blocks


def test_the_working_set_takes_each_signals_own_top_last_when_asked():
    saved = _ranked(40)
    rank = {b: i for i, b in enumerate(saved)}
    signal = SimpleNamespace(similarity=lambda b: -rank[b], own_tops=lambda blocks, n: [saved[30], saved[2]][:n])
    plain = ConversationMemory._working_set(_memory(2048, recovery_signal_tops=0), saved, [], signal)
    assert len(plain) == 16 and saved[30] not in plain
    tops = ConversationMemory._working_set(_memory(2048, recovery_signal_tops=2), saved, [], signal)
    assert tops[saved[30]] == 16 and len(tops) == 17       # b2 was in already: no repeat


def test_old_questions_rank_after_statements_only_when_the_message_asks():
    questions = [_block(f"user#{i}", f"Remind me: What limit did we set for the {w} queue? Just the value.")
                 for i, w in enumerate(["export", "import", "retry"])]
    facts = _ranked(20)
    pool = [*questions, *facts]                       # the questions rank first
    rank = {b: i for i, b in enumerate(pool)}
    signal = SimpleNamespace(similarity=lambda b: -rank[b])
    asked = "Sorry, I forgot: How many workers did the backup use?"
    plain = ConversationMemory._working_set(_memory(2048, asked, recovery_questions_last=False), pool, [], signal)
    assert all(q in plain for q in questions)
    last = ConversationMemory._working_set(_memory(2048, asked, recovery_questions_last=True), pool, [], signal)
    assert not any(q in last for q in questions) and facts[15] in last
    told = ConversationMemory._working_set(_memory(2048, "The backup now uses 6 workers.",
                                                   recovery_questions_last=True), pool, [], signal)
    assert all(q in told for q in questions)          # a message that states asks nothing: the order is the signal's


@pytest.mark.parametrize("budget", [256, 512, 1024])
def test_budgets_up_to_the_width_unit_decide_as_before(budget):
    questions = [_block(f"user#{i}", f"Remind me: What limit did we set for the {w} queue? Just the value.")
                 for i, w in enumerate(["export", "import", "retry"])]
    facts = _ranked(20)
    pool = [*questions, *facts]
    rank = {b: i for i, b in enumerate(pool)}
    signal = SimpleNamespace(similarity=lambda b: -rank[b], own_tops=lambda blocks, n: [facts[-1]])
    asked = "Sorry, I forgot: How many workers did the backup use?"
    plain = ConversationMemory._working_set(_memory(budget, asked, recovery_questions_last=False,
                                                    recovery_signal_tops=0), pool, [], signal)
    levers = ConversationMemory._working_set(_memory(budget, asked, recovery_questions_last=True,
                                                     recovery_signal_tops=2), pool, [], signal)
    assert plain == levers and len(levers) == 8
