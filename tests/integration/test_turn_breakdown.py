"""Every reply says where its turn went (issue 44): recovery decision, embedding, restores, prompt decode, sampling,
token decode, detokenising and the engine's own Python, for the whole turn and up to the first token; the
conversation's stats carry the last turn's, and the reply's stored metrics keep it."""

from __future__ import annotations

import pytest

from evoke_engine import Engine, Settings
from evoke_engine.conversations.breakdown import PHASES
from evoke_engine.conversations.reply_row import reply_metrics


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    settings = Settings(home=str(tmp_path_factory.mktemp("breakdown")), budget_tokens=320, n_ctx=2048, slots=1,
                        embedder="off")
    with Engine(settings, prewarm=False) as eng:
        yield eng


def test_a_replys_breakdown_adds_up_to_its_first_token_and_its_turn(engine):
    conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
    reply = conv.submit("Name three colours.", max_tokens=12, temperature=0).result()
    whole, first = reply.breakdown, reply.breakdown["first_token"]
    for part in (whole, first):
        assert all(part[f"{phase}_s"] >= 0 for phase in PHASES) and part["python_s"] >= 0
        assert sum(part[f"{phase}_s"] for phase in PHASES) + part["python_s"] == pytest.approx(part["total_s"],
                                                                                               abs=1e-5)
    assert first["total_s"] == pytest.approx(reply.ttft_s, abs=1e-5)
    assert first["prompt_decode_s"] > 0 and first["sample_s"] > 0 and first["token_decode_s"] == 0
    assert whole["token_decode_s"] > 0 and whole["total_s"] >= first["total_s"]
    assert conv.stats().turn_breakdown == whole
    assert reply_metrics(reply)["metrics"]["breakdown"] == whole
