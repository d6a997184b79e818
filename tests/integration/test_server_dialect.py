"""The OpenAI dialect coding tools expect (issue 45), through the official `openai` client on loopback and the
real embedded model: constrained replies (json_object, json_schema with `.parse()`, forced tools, `grammar`),
sampling fields honoured by llama.cpp's samplers or refused by name, cached-token usage with Evoke's figures
apart, the context-overflow error litellm recognises, `GET /v1/models/{id}`, /health while loading, CORS."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest
from fastapi.testclient import TestClient
from helpers.server_fixtures import client_for, running_server
from pydantic import BaseModel

from evoke_engine import Engine, Settings
from evoke_engine.server.app import create_app

KEY = "dialect-key-45"
ORIGIN = "https://chat.example.com"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("dialect"), api_key=KEY, cors_origins=[ORIGIN]) as (engine, server):
        yield engine, server, client_for(server, api_key=KEY)


def ask(client, content, **kw):
    kw.setdefault("max_tokens", 96)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model="evoke", messages=[{"role": "user", "content": content}], **kw)


@pytest.mark.parametrize("prompt", ["Describe Paris.", "List three colours.", "Who are you?",
                                    "What is 2 + 2?", "Give me a recipe for tea."])
def test_json_object_replies_parse(served, prompt):
    _, _, client = served
    reply = ask(client, prompt + " Reply in JSON.", response_format={"type": "json_object"}, max_tokens=160)
    assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
    json.loads(reply.choices[0].message.content)


class City(BaseModel):
    city: str
    country: str


def test_json_schema_reply_parses_with_the_sdk(served):
    _, _, client = served
    reply = client.beta.chat.completions.parse(
        model="evoke", messages=[{"role": "user", "content": "Name a city and its country."}],
        response_format=City, temperature=0, max_tokens=96)
    parsed = reply.choices[0].message.parsed
    assert isinstance(parsed, City) and parsed.city


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_tool_call(served, choice):
    _, _, client = served
    prompt = "Write one short sentence about the sea."        # a prompt that calls no tool by itself
    free = ask(client, prompt, tools=[WEATHER, CLOCK])
    assert not free.choices[0].message.tool_calls
    forced = ask(client, prompt, tools=[WEATHER, CLOCK], tool_choice=choice)
    calls = forced.choices[0].message.tool_calls
    assert forced.choices[0].finish_reason == "tool_calls" and len(calls) == 1
    if isinstance(choice, dict):
        assert calls[0].function.name == "get_time"
    assert calls[0].function.name in ("get_weather", "get_time")
    assert isinstance(json.loads(calls[0].function.arguments), dict)


def test_grammar_extension(served):
    _, _, client = served
    reply = ask(client, "Is the sky blue?", extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert reply.choices[0].message.content in ("yes", "no")
    with pytest.raises(openai.BadRequestError, match="grammar"):
        ask(client, "Is the sky blue?", extra_body={"grammar": "root ::= ("})


def test_logit_bias_and_penalties_are_honoured(served):
    engine, _, client = served
    free = ask(client, "Name a colour.", max_tokens=4).choices[0].message.content
    first = engine.tokenize(free, special=False)[0]
    banned = ask(client, "Name a colour.", max_tokens=4, logit_bias={str(first): -100}).choices[0].message.content
    assert engine.tokenize(banned, special=False)[0] != first
    penalised = ask(client, "Count: one one one one one", max_tokens=24, frequency_penalty=2.0, presence_penalty=2.0,
                    extra_body={"top_k": 5, "min_p": 0.1})
    assert penalised.choices[0].message.content is not None


@pytest.mark.parametrize("field", [{"audio": {"voice": "alloy"}}, {"functions": [{"name": "f"}]},
                                   {"modalities": ["text", "audio"]}, {"n": 2}])
def test_unsupported_field_is_refused_by_name(served, field):
    _, server, _ = served
    body = {"model": "evoke", "messages": [{"role": "user", "content": "hi"}], **field}
    response = httpx.post(server.address + "/chat/completions", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 400
    assert next(iter(field)) in response.json()["error"]["message"]


def test_cached_tokens_on_the_second_turn(served):
    _, _, client = served
    history = [{"role": "user", "content": "Tell me about the moon in two sentences."}]
    first = client.chat.completions.create(model="evoke", messages=history, max_tokens=24, temperature=0,
                                           extra_headers={"X-Evoke-Session": "cached"})
    assert "evoke" not in (first.usage.model_extra or {})
    assert first.model_extra["evoke"]["conversation_id"]
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And the sun?"}]
    second = client.chat.completions.create(model="evoke", messages=history, max_tokens=8, temperature=0,
                                            extra_headers={"X-Evoke-Session": "cached"})
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < second.usage.prompt_tokens
    assert cached == second.model_extra["evoke"]["cached"]


def test_context_overflow_is_worded_as_openai(served):
    engine, _, client = served
    huge = "word " * (engine.settings.n_ctx * 2)
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, huge)
    error = caught.value.body
    assert error["code"] == "context_length_exceeded" and error["type"] == "invalid_request_error"
    # litellm's exception mapping turns exactly this phrase into ContextWindowExceededError
    assert "This model's maximum context length is " in error["message"]


def test_litellm_reads_the_overflow_as_a_context_window_error(served, monkeypatch):
    """aider's client library, unmodified: its exception mapping must give ContextWindowExceededError (aider then
    says the context is full instead of failing), and a normal reply keeps OpenAI's cached-token usage."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")        # no fetch of the price list at import
    import litellm
    engine, server, _ = served
    ask = dict(model="openai/evoke", api_base=server.address, api_key=KEY, max_retries=0, max_tokens=4)
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(messages=[{"role": "user", "content": "word " * (engine.settings.n_ctx * 2)}], **ask)
    reply = litellm.completion(messages=[{"role": "user", "content": "Say hi."}], **ask)
    assert reply.usage.prompt_tokens_details.cached_tokens > 0          # the shared system prompt was not decoded


def test_model_card_has_the_context_length(served):
    engine, _, client = served
    card = client.models.retrieve("evoke")
    extra = card.model_extra
    assert extra["context_length"] == extra["max_model_len"] > 0
    assert extra["meta"]["n_ctx_train"] == engine.model_info().n_ctx_train
    assert extra["meta"]["budget_tokens"] == engine.settings.budget_tokens
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_cors_preflight_with_any_header_and_on_refusals(served):
    _, server, _ = served
    preflight = httpx.options(server.address + "/chat/completions", timeout=30, headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type,x-stainless-os,x-stainless-retry-count"})
    assert preflight.status_code == 200
    assert "x-stainless-os" in preflight.headers["access-control-allow-headers"].lower()
    refused = httpx.get(server.address + "/models", timeout=30, headers={"Origin": ORIGIN})
    assert refused.status_code == 401
    assert refused.headers["access-control-allow-origin"] == ORIGIN


def test_health_is_503_until_the_model_loads(tmp_path):
    engine = Engine(Settings(home=str(tmp_path), model_path=str(tmp_path / "missing.gguf")), wait=False,
                    scheduler=False)
    try:
        with TestClient(create_app(engine, state_dir=tmp_path)) as http:
            response = http.get("/health", headers={"Host": "127.0.0.1"})
            assert response.status_code == 503
            assert response.json()["status"] in ("loading", "error") and response.json()["reason"]
    finally:
        engine.close()


def test_logprobs_per_position(served):
    _, server, client = served
    reply = ask(client, "Name a fruit.", max_tokens=8, logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert content and "".join(item.token for item in content).startswith(reply.choices[0].message.content.strip()[:1])
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        assert sum(math.exp(alt.logprob) for alt in item.top_logprobs) <= 1 + 1e-6
        assert item.top_logprobs[0].logprob >= item.logprob - 1e-9     # greedy: the sampled token is the likeliest
    streamed = httpx.post(server.address + "/chat/completions", timeout=60, headers={"Authorization": f"Bearer {KEY}"},
                          json={"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "stream": True})
    assert streamed.status_code == 400 and "logprobs" in streamed.json()["error"]["message"]


def test_embeddings_have_the_embedders_dimension(served):
    engine, _, client = served
    result = client.embeddings.create(model="evoke", input=["a cat sat on the mat", "a kitten on a rug", "tax law"])
    dimension = engine.thread.call(lambda: engine.diagnostics().embedder.dimension())
    vectors = [item.embedding for item in result.data]
    assert [len(v) for v in vectors] == [dimension] * 3
    similar = sum(a * b for a, b in zip(vectors[0], vectors[1], strict=True))
    unrelated = sum(a * b for a, b in zip(vectors[0], vectors[2], strict=True))
    assert similar > unrelated
    single = client.embeddings.create(model="evoke", input="one text")      # the SDK asks for base64
    assert len(single.data[0].embedding) == dimension


def test_metrics_in_prometheus_text(served):
    _, server, client = served
    ask(client, "Say hi.", max_tokens=4)
    text = httpx.get(server.address.removesuffix("/v1") + "/metrics", timeout=30,
                     headers={"Authorization": f"Bearer {KEY}"}).text
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and line[0] != "#"}
    assert values["evoke_requests_total"] >= 1 and values["evoke_completion_tokens_total"] >= 1
    assert values['evoke_time_to_first_token_seconds_bucket{le="+Inf"}'] == values[
        "evoke_time_to_first_token_seconds_count"] >= 1
    assert values["evoke_model_loaded"] == 1 and "evoke_kv_disk_bytes" in values
    assert values["evoke_pool_ram_bytes"] >= 0 and values["evoke_restores_total"] >= 0
    assert values["evoke_replies_streaming"] == values["evoke_replies_waiting"] == 0     # nothing in flight now
    assert values["evoke_replies_suspended"] == 0


def test_sse_pings_while_waiting(served, monkeypatch):
    _, server, _ = served
    monkeypatch.setattr("evoke_engine.server.app.PING_S", 0.001)
    body = {"model": "evoke", "stream": True, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "Summarise: " + "the tide rolls in. " * 150}]}
    with httpx.stream("POST", server.address + "/chat/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {KEY}"}) as response:
        lines = list(response.iter_lines())
    assert ": ping" in lines
    assert [line for line in lines if line][-1] == "data: [DONE]"
