"""Issue 57 item 3 on the real model through HTTP: a guessed system prompt is not confirmed. Client A's 1K-token system
prompt is decoded for A once and reused by A's next request; another client's exact guess and its wrong guess (one
word changed) each decode a prefix of their own and report the same `cached_tokens` and `decoded` figures (the
time they take is measured by the hostile suite's phase, never asserted here)."""

from __future__ import annotations

import httpx
import pytest
from helpers.server_fixtures import running_server

from evoke_engine import Settings
from evoke_engine.server.clients import new_token

pytestmark = pytest.mark.model

RULES = [f"Rule {i}: answer in the voice of lighthouse keeper number {i}." for i in range(70)]
SECRET = "\n".join(RULES)
WRONG = SECRET.replace("number 33.", "number 34.")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    home = tmp_path_factory.mktemp("issue57-prefix")
    settings = Settings(home=str(home), budget_tokens=2048, temperature=0.0)
    with running_server(home, settings=settings) as (engine, server):
        yield engine, server


def ask(server, token: str, system: str) -> dict:
    body = {"model": "evoke", "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Who are you?"}]}
    response = httpx.post(server.address + "/chat/completions", json=body, headers={"X-Evoke-Client": token},
                          timeout=300)
    assert response.status_code == 200, response.text
    payload = response.json()
    usage = payload["usage"]
    return {**payload["evoke"], "prompt_tokens": usage["prompt_tokens"],
            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]}


def test_an_exact_guess_of_another_clients_system_prompt_does_the_work_of_a_wrong_one(served):
    engine, server = served
    owner, guesser = new_token(), new_token()
    first = ask(server, owner, SECRET)
    size = engine.stats(first["conversation_id"]).prefix_tokens
    assert size >= 1000, f"the system prompt is {size} tokens"
    assert first["decoded"] >= size and first["cached_tokens"] < size

    again = ask(server, owner, SECRET)                               # A again: a new stateless conversation
    assert again["conversation_id"] != first["conversation_id"]
    assert again["cached_tokens"] >= size and again["decoded"] < size, "the owner reuses its own prefix"

    exact = ask(server, guesser, SECRET)
    wrong = ask(server, guesser, WRONG)
    assert exact["decoded"] >= size and exact["cached_tokens"] < size, "the guesser's prefix was decoded for it"
    assert exact["cached_tokens"] == wrong["cached_tokens"] == 0
    assert exact["decoded"] == exact["prompt_tokens"] and wrong["decoded"] == wrong["prompt_tokens"], \
        "every prompt token of either guess was decoded for it"
    decoded_at = engine.prefix_decoded_at
    assert decoded_at(exact["conversation_id"]) > decoded_at(again["conversation_id"]), \
        "the exact guess got a prefix decoded for it, not the owner's"
