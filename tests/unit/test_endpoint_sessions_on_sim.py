"""The endpoint's session logic on a whole Engine over the simulated backend (issue 47): the FastAPI app in-process
(no socket, no model). A session that sends its whole history continues its conversation (only the new message is
decoded), a rewritten earlier message forks at the last agreeing reply and leaves the original alone, a request
that fails rolls its conversation back (the client's retry continues it), and two clients' same session name are
two conversations."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from helpers.sim_backend import SimBackend, conversation_text, rendered, sim_engine, sim_settings

from evoke_engine.server import ServerConfig
from evoke_engine.server.app import create_app
from evoke_engine.server.clients import new_token

pytestmark = pytest.mark.unit


@pytest.fixture
def backend(tmp_path):
    return SimBackend(tmp_path / "sim.gguf")


@pytest.fixture
def served(backend, tmp_path):
    with sim_engine(backend, sim_settings(tmp_path)) as (engine, _), \
            TestClient(create_app(engine, ServerConfig()), base_url="http://127.0.0.1:8765",
                       raise_server_exceptions=False) as client:
        yield engine, client


def chat(client, messages, *, session="s1", token=None):
    headers = {"X-Evoke-Session": session, "X-Evoke-Client": token or TOKEN}
    response = client.post("/v1/chat/completions", headers=headers,
                           json={"model": "evoke", "messages": messages, "max_tokens": 16})
    assert response.status_code == 200, response.text
    body = response.json()
    return body["choices"][0]["message"]["content"], body["evoke"], response.headers["X-Evoke-Conversation"]


TOKEN = new_token()


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def test_a_session_that_sends_its_whole_history_continues_its_conversation(served):
    engine, client = served
    first, figures, conversation_id = chat(client, [user("one")])
    assert figures["route"] == "new"
    second, figures, same = chat(client, [user("one"), assistant(first), user("two")])
    assert same == conversation_id and figures["route"] == "continue"
    assert figures["decoded"] < 10, "only the new message and its frame were decoded"
    assert [m["text"] for m in engine.messages(conversation_id)] == ["one", first, "two", second]
    assert conversation_text(engine, conversation_id) == rendered(engine, conversation_id)


def test_a_rewritten_earlier_message_forks_at_the_last_agreeing_reply(served):
    engine, client = served
    a1, _, original = chat(client, [user("one")])
    a2, _, _ = chat(client, [user("one"), assistant(a1), user("two")])
    _, figures, forked = chat(client, [user("one"), assistant(a1), user("two, rewritten")])
    assert figures["route"] == "fork" and forked != original
    assert [m["text"] for m in engine.messages(forked)][:2] == ["one", a1]
    assert [m["text"] for m in engine.messages(original)] == ["one", a1, "two", a2]
    assert conversation_text(engine, forked) == rendered(engine, forked)
    assert conversation_text(engine, original) == rendered(engine, original)


def test_a_failed_turn_in_a_session_rolls_its_conversation_back(served, backend):
    engine, client = served
    a1, _, conversation_id = chat(client, [user("one")])
    backend.script(RuntimeError("the sampler broke"))
    response = client.post("/v1/chat/completions", headers={"X-Evoke-Session": "s1", "X-Evoke-Client": TOKEN},
                           json={"model": "evoke", "messages": [user("one"), assistant(a1), user("two")]})
    assert response.status_code >= 500
    assert [m["text"] for m in engine.messages(conversation_id)] == ["one", a1]
    engine.check(conversation_id)
    again, figures, same = chat(client, [user("one"), assistant(a1), user("two")])     # the client retries
    assert same == conversation_id and figures["route"] == "continue"
    assert [m["text"] for m in engine.messages(conversation_id)] == ["one", a1, "two", again]
    assert conversation_text(engine, conversation_id) == rendered(engine, conversation_id)


def test_two_clients_with_the_same_session_name_get_two_conversations(served):
    engine, client = served
    _, _, mine = chat(client, [user("hello")])
    _, figures, theirs = chat(client, [user("hello")], token=new_token())
    assert theirs != mine and figures["route"] == "new"
