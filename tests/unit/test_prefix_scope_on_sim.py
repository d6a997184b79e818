"""Issue 57 item 3 on a whole Engine over the simulated backend: a shared system-prompt prefix is shared only within an
owner, or when it is the prewarmed default. Another client sending exactly client A's 1K-token system prompt does the
same work as one sending a wrong guess (its own prefix decoded, nothing of A's counted as cached), the same client
still reuses its own prefix, and the configured default prompt stays shared by everyone."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from helpers.sim_backend import SimBackend, sim_engine, sim_settings

from evoke_engine.server import ServerConfig
from evoke_engine.server.app import create_app
from evoke_engine.server.clients import new_token

pytestmark = pytest.mark.unit

WORDS = 1000
SECRET = " ".join(f"rule{i}" for i in range(WORDS))                   # A's system prompt: about 1K toy tokens
WRONG = " ".join(f"rule{i}" if i != WORDS // 2 else "guess" for i in range(WORDS))   # one word off


@pytest.fixture
def served(tmp_path):
    backend = SimBackend(tmp_path / "sim.gguf")
    with sim_engine(backend, sim_settings(tmp_path, budget_tokens=2048)) as (engine, _), \
            TestClient(create_app(engine, ServerConfig()), base_url="http://127.0.0.1:8765",
                       raise_server_exceptions=False) as client:
        yield engine, client


def ask(client, token: str, question: str, system: str | None = None) -> dict:
    messages = ([{"role": "system", "content": system}] if system is not None else []) + \
        [{"role": "user", "content": question}]
    response = client.post("/v1/chat/completions", headers={"X-Evoke-Client": token},
                           json={"model": "evoke", "messages": messages, "max_tokens": 4})
    assert response.status_code == 200, response.text
    body = response.json()
    return {**body["evoke"], "cached_tokens": body["usage"]["prompt_tokens_details"]["cached_tokens"],
            "prompt_tokens": body["usage"]["prompt_tokens"]}


def prefix_tokens(engine, conversation_id: str) -> int:
    return engine.stats(conversation_id).prefix_tokens


def test_a_guessed_system_prompt_of_another_owner_does_the_work_of_a_wrong_guess(served):
    engine, client = served
    owner_a, guesser = new_token(), new_token()
    first = ask(client, owner_a, "What is the rule?", SECRET)
    size = prefix_tokens(engine, first["conversation_id"])
    assert size > WORDS, "the system prompt is about 1K tokens"
    assert first["decoded"] >= size and first["cached_tokens"] < size, "a new prompt is decoded, not cached"

    again = ask(client, owner_a, "Another question?", SECRET)          # A, a new stateless conversation
    assert again["conversation_id"] != first["conversation_id"] and again["route"] == "new"
    assert again["cached_tokens"] >= size and again["decoded"] < size, "the same owner reuses its own prefix"

    exact = ask(client, guesser, "What is the rule?", SECRET)
    wrong = ask(client, guesser, "What is the rule?", WRONG)
    assert exact["decoded"] >= size and exact["cached_tokens"] < size, "the exact guess decoded the prefix itself"
    assert (exact["decoded"], exact["cached_tokens"]) == (wrong["decoded"], wrong["cached_tokens"])
    assert exact["prompt_tokens"] == wrong["prompt_tokens"]

    decoded_at = engine.prefix_decoded_at
    mine, theirs = decoded_at(first["conversation_id"]), decoded_at(exact["conversation_id"])
    assert mine is not None and theirs is not None and theirs > mine, "the guesser's prefix is a decode of its own"


def test_the_configured_default_prompt_is_shared_by_every_owner(served):
    engine, client = served
    one = ask(client, new_token(), "Hello?")       # no system message, no tools: the configured default prompt
    other = ask(client, new_token(), "Hello?")     # another owner
    size = prefix_tokens(engine, one["conversation_id"])
    assert size > 0 and one["decoded"] >= size, "the first request decoded it (the prewarmed one carries the tools)"
    assert other["cached_tokens"] >= size and other["decoded"] < size, "another owner shares the default prompt"
