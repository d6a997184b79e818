"""Issue 58 item 7, pinned: the same seeded request on one engine, before and after other conversations, should
give the same tokens and log-probabilities. It does not yet (strict xfail): the sampler is fresh per reply and the
prefix K/V are the same saved bytes, but which cells a conversation's tokens occupy in its slot's context (after the
prefix sequences and earlier conversations) changes the order llama.cpp's CPU attention sums in, so a seeded draw
near a boundary flips. When every slot context is laid out alike (or flash attention is on), this passes."""

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


@pytest.mark.xfail(strict=True, reason="cell placement in a slot's context leaks into the attention's rounding "
                                       "(issue 58 item 7): not fixed")
def test_a_seeded_request_gives_the_same_reply_whatever_ran_before(tmp_path):
    with Engine(Settings(home=str(tmp_path), embedder="off"), scheduler=False) as engine:
        first = seeded_reply(engine)
        for i in range(6):
            other = engine.new_conversation(system_prompt=None if i % 2 else "You are terse.")
            other.submit("Tell me about rivers and tea " * (i + 1), max_tokens=8 + 4 * i, temperature=0.8).result()
        assert seeded_reply(engine) == first
