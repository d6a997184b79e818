"""Recovery with line-level and lexical signals on the real model and embedder: the block holding a
one-line fact comes back for a reworded question, and the decision is explained in events and stats."""

from __future__ import annotations

import pytest

from evoke_engine import Engine, Settings

NOISE = ["The README explains how to run the tests locally.", "Docker images are rebuilt weekly.",
         "Secrets never go into the repository.", "Linting runs before every commit.",
         "Old branches are deleted after merge.", "Dashboards are reviewed in the Monday meeting.",
         "Code review needs one approval from the owning team.", "Alerts are routed to the shared channel."]


def document(fact: str, at: int) -> str:
    lines = [f"{i}. {NOISE[i % len(NOISE)]}" for i in range(40)]
    lines.insert(at, fact)
    return "\n".join(lines)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    # The narrow recovery (no overdraft), as the test was written for: a wide one's working set brings the handbook's
    # fact block back on the filler turns already (their top 8 reaches it), so it is not saved when the probe comes.
    settings = Settings(home=str(tmp_path_factory.mktemp("recall")), budget_tokens=384, n_ctx=4096, slots=2,
                        recall_signal="lines+lexical", recall_user_margin=0.1, tools_enabled=False,
                        recovery_overdraft_tokens=0)
    with Engine(settings, prewarm=False) as eng:
        yield eng


def test_the_block_with_the_fact_comes_back_and_the_decision_is_explained(engine):
    conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
    fact = "Crash dumps are collected in /srv/kestrel/dumps."
    conv.send("Here is my handbook, reply OK.", attachments=[("handbook.txt", document(fact, 25))], max_tokens=3,
              temperature=0)
    for question in ("Write a Python function that merges two sorted lists.", "What is the opposite of hot?"):
        conv.send(question, max_tokens=60, temperature=0)
    holding = next(b for b in conv.blocks(with_text=True) if "/srv/kestrel/dumps" in b["text"])
    assert holding["state"] == "ram"
    conv.send("Which directory receives the post-mortem core files after a crash?", max_tokens=24, temperature=0)
    stats = conv.stats().as_dict()
    decisions = [d for d in stats["recovery_decisions"] if d["block"] == holding["name"]]
    assert decisions, stats["recovery_decisions"]
    detail = decisions[-1]
    assert detail["signal"] == "lines+lexical" and "kestrel" in detail["best_line"]
    assert {"block_cosine", "line_cosine", "bm25", "dense_rank", "lexical_rank", "fused"} <= set(detail)
    events = [e for e in stats["events"] if e["kind"] == "recovered" and e["block"] == holding["name"]]
    assert events and events[-1]["detail"]["best_line"] == detail["best_line"]
    assert not any(d["block"].startswith("user#1") for d in stats["recovery_decisions"])
    conv.check()
