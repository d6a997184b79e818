"""Issue 58 item 7, pinned: the same seeded request on one engine, before and after other conversations, gives the
same tokens and log-probabilities. The sampler is fresh per reply and the prefix K/V are the same saved bytes; what
leaked was cell placement: slot 0's context also held the prefix sequences, so a conversation there sat at other
cells than in the other slots, and llama.cpp's CPU attention summed in another order (a seeded draw near a boundary
flipped). The prefixes now live in a context of their own and every slot holds its conversation alike; the test
runs in each slot layout that promises it."""

from __future__ import annotations

import pytest

from evoke_engine import Engine, Settings

SEEDED = {"max_tokens": 24, "temperature": 1.0, "seed": 123, "logprobs": 0}


def seeded_reply(engine: Engine) -> tuple[str, list[float]]:
    reports: list[dict] = []
    conv = engine.new_conversation(system_prompt="You are a poet.")
    reply = conv.submit("Write a short poem about the sea.", on_logprobs=reports.append, **SEEDED).result()
    engine.delete_conversation(conv.id)
    return reply.text, [round(r["logprob"], 6) for r in reports]


@pytest.mark.parametrize("layout", ["streams", "contexts"])
def test_a_seeded_request_gives_the_same_reply_whatever_ran_before(tmp_path, layout):
    with Engine(Settings(home=str(tmp_path), embedder="off", slot_layout=layout), scheduler=False) as engine:
        first = seeded_reply(engine)
        for i in range(6):
            other = engine.new_conversation(system_prompt=None if i % 2 else "You are terse.")
            other.submit("Tell me about rivers and tea " * (i + 1), max_tokens=8 + 4 * i, temperature=0.8).result()
        assert seeded_reply(engine) == first
