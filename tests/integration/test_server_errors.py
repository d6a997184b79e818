"""OpenAI-shaped errors with the right status, the Host-header refusal, the key, and a client that
disconnects mid-stream (generation cancelled, partial reply kept); the server keeps serving after each."""

from __future__ import annotations

import httpx
import openai
import pytest
from helpers.server_fixtures import client_for, running_server

KEY = "test-key-123"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("errors"), api_key=KEY) as (engine, server):
        yield engine, server, client_for(server, api_key=KEY)


def post(server, body, *, key=KEY, headers=None, content=None):
    headers = {"Authorization": f"Bearer {key}", **(headers or {})}
    kw = {"content": content} if content is not None else {"json": body}
    return httpx.post(server.address + "/chat/completions", headers=headers, timeout=120, **kw)


def still_serving(client):
    reply = client.chat.completions.create(model="evoke", messages=[{"role": "user", "content": "Say hi."}],
                                           max_tokens=4, temperature=0)
    assert reply.choices[0].message.content is not None


def test_malformed_json_is_400(served):
    _, server, client = served
    response = post(server, None, content=b'{"messages": [', headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert set(response.json()["error"]) >= {"message", "type", "code"}
    still_serving(client)


@pytest.mark.parametrize("body", [{"model": "evoke"}, {"model": "evoke", "messages": []},
                                  {"model": "evoke", "messages": [{"role": "user", "content": 5}]},
                                  {"model": "evoke", "messages": [{"role": "user", "content": "x"}],
                                   "temperature": "hot"}])
def test_missing_empty_or_mistyped_is_400(served, body):
    _, server, client = served
    response = post(server, body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"]


def test_unknown_fields_are_ignored(served):
    _, server, _ = served
    response = post(server, {"model": "evoke", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4,
                             "logit_bias": {}, "parallel_tool_calls": True, "frequency_penalty": 0})
    assert response.status_code == 200, response.text


def test_unknown_model_is_404(served):
    _, _, client = served
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    still_serving(client)


def test_prompt_larger_than_the_context_is_400_with_limits(served):
    engine, _, client = served
    huge = "word " * (engine.settings.n_ctx + 500)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="evoke", messages=[{"role": "user", "content": huge}])
    assert err.value.body["code"] == "context_length_exceeded"
    length = engine.settings.n_ctx // engine.settings.slots      # the one context /v1/models advertises (issue 58)
    assert f"maximum context length is {length} tokens" in err.value.body["message"]
    still_serving(client)


def test_wrong_or_missing_key_is_401(served):
    _, server, client = served
    with pytest.raises(openai.AuthenticationError):
        client_for(server, api_key="wrong-key").chat.completions.create(
            model="evoke", messages=[{"role": "user", "content": "hi"}])
    missing = httpx.get(server.address + "/models", timeout=30)
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(server.address.removesuffix("/v1") + "/health", timeout=30).status_code == 200
    still_serving(client)


def test_foreign_host_header_is_refused(served):
    _, server, client = served
    response = post(server, {"messages": [{"role": "user", "content": "hi"}]}, headers={"Host": "attacker.example"})
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "host_not_allowed"
    assert "access-control-allow-origin" not in {k.lower() for k in response.headers}
    still_serving(client)


def test_no_cors_headers_by_default(served):
    _, server, _ = served
    response = httpx.get(server.address + "/models", headers={"Authorization": f"Bearer {KEY}",
                                                             "Origin": "https://example.com"}, timeout=30)
    assert response.status_code == 200
    assert "access-control-allow-origin" not in {k.lower() for k in response.headers}


def test_session_ids_are_checked(served):
    _, server, _ = served
    response = post(server, {"messages": [{"role": "user", "content": "hi"}]},
                    headers={"X-Evoke-Session": "../../etc/passwd\x7f"})
    assert response.status_code == 400


def test_disconnect_mid_stream_cancels_and_keeps_the_partial_reply(served):
    engine, server, client = served
    body = {"model": "evoke", "stream": True, "max_tokens": 400, "temperature": 0,
            "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]}
    headers = {"Authorization": f"Bearer {KEY}", "X-Evoke-Session": "t-disconnect"}
    with httpx.stream("POST", server.address + "/chat/completions", json=body, headers=headers,
                      timeout=120) as response:
        conv_id = response.headers["X-Evoke-Conversation"]
        lines = 0
        for line in response.iter_lines():
            lines += bool(line.startswith("data:"))
            if lines >= 6:
                break                          # leave mid-stream: the connection closes here
    still_serving(client)                       # queued behind the cancelled turn, so it has ended
    messages = engine.open_conversation(conv_id).messages()
    assert [m["role"] for m in messages] == ["user", "assistant"]
    reply = messages[1]["text"]
    assert reply and len(engine.tokenize(reply)) < 400
