"""Issue 58 items 2, 4 and 6 on the real embedded model through the `openai` client: usage counts every prompt token
once (cached + decoded + reused, also in /metrics) and times the first token from the request's arrival; one context
length is advertised, enforced and named in the overflow error, and a max_tokens that cannot fit is a 400; a tool
call cut by max_tokens is `length` with no tool markup in the content."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid

import httpx
import openai
import pytest
from helpers.processes import ROOT, environment
from helpers.server_fixtures import client_for, running_server

from evoke_engine.server.api_errors import context_tokens

WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"type": "string"}}, "required": ["city"]}}}]
FORCED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("issue58")) as (engine, server):
        yield engine, server, client_for(server)


# -- item 6: a tool call cut by max_tokens -----------------------------------------------------------------------------
def test_a_cut_tool_call_is_length_with_no_markup(served):
    _, _, client = served
    ask = dict(model="evoke", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=WEATHER,
               tool_choice=FORCED, max_tokens=12, temperature=0)     # cut after `<tool_call>{"name":"`
    done = client.chat.completions.create(**ask)
    choice = done.choices[0]
    assert choice.finish_reason == "length"
    assert not choice.message.tool_calls and not (choice.message.content or "").strip()      # nothing of the call
    content, finish = "", None
    for chunk in client.chat.completions.create(**ask, stream=True):
        if chunk.choices:
            content += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
            assert not chunk.choices[0].delta.tool_calls
    assert finish == "length" and not content.strip()
    whole = client.chat.completions.create(**{**ask, "max_tokens": 64})
    assert whole.choices[0].finish_reason == "tool_calls"             # uncut, the same call is a call


# -- item 4: one context length ----------------------------------------------------------------------------------------
def test_one_context_length_is_advertised_enforced_and_named(served, tmp_path):
    engine, server, client = served
    length = context_tokens(engine.settings)
    assert client.models.retrieve("evoke").model_extra["context_length"] == length
    metadata = subprocess.run([sys.executable, "-m", "evoke_engine", "aider-metadata"], cwd=ROOT,
                              env=environment(tmp_path), capture_output=True, text=True, timeout=120)
    assert json.loads(metadata.stdout)["openai/evoke"]["max_input_tokens"] == length
    words = "word " * length                                   # more tokens than the context, fewer than n_ctx
    assert len(engine.tokenize(words, special=False)) < engine.settings.n_ctx
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="evoke", messages=[{"role": "user", "content": words}], max_tokens=4)
    error = caught.value.body
    assert error["code"] == "context_length_exceeded"
    assert f"maximum context length is {length} tokens" in error["message"]
    numbers = {int(n) for n in re.findall(r"\d+", error["message"])}
    assert not numbers & {engine.settings.n_ctx, engine.settings.n_ctx - 2 * engine.settings.block_tokens}


def test_max_tokens_beyond_the_context_is_a_400(served):
    engine, _, client = served
    length = context_tokens(engine.settings)
    for field in ("max_tokens", "max_completion_tokens"):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="evoke", messages=[{"role": "user", "content": "Hi"}],
                                           **{field: 100000})
        assert caught.value.body["code"] == "context_length_exceeded"
        assert f"maximum context length is {length} tokens" in caught.value.body["message"]
        assert "max_tokens" in caught.value.body["message"]
    done = client.chat.completions.create(model="evoke", messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=length // 2)      # within the context: served
    assert done.choices[0].message.content is not None


# -- item 2: usage -----------------------------------------------------------------------------------------------------
def figures(done) -> dict:
    return done.model_extra["evoke"]


def test_a_new_system_prompt_is_decoded_not_cached(served):
    _, _, client = served
    system = f"You are assistant {uuid.uuid4().hex}. " + "Answer briefly and precisely. " * 30
    ask = dict(model="evoke", max_tokens=4, temperature=0,
               messages=[{"role": "system", "content": system}, {"role": "user", "content": "Say hi."}])
    first = client.chat.completions.create(**ask)
    evoke = figures(first)
    assert first.usage.prompt_tokens == evoke["cached"] + evoke["decoded"] + evoke["reused"]
    assert first.usage.prompt_tokens_details.cached_tokens == 0 == evoke["cached"]
    assert evoke["decoded"] > 150                                       # the system prompt was decoded for it
    assert evoke["ttft_ms"] >= evoke["engine_ttft_ms"]                  # from the arrival, prefix decode included
    second = client.chat.completions.create(**ask)                      # the same prompt again: its prefix is warm
    assert second.usage.prompt_tokens == first.usage.prompt_tokens
    assert second.usage.prompt_tokens_details.cached_tokens >= evoke["decoded"] - 20


def test_prompt_tokens_are_the_same_for_the_same_prompt_whatever_is_reused(served):
    _, server, client = served
    note = " ".join(f"Line {i}: the value of key{i} is {i * 7 % 13}." for i in range(40))
    asks = [dict(model="evoke", max_tokens=2, temperature=0,
                 messages=[{"role": "user", "content": f"{note}\nQuestion {k}: which key is 3?"}]) for k in range(2)]
    done = [client.chat.completions.create(**ask) for ask in asks]
    counts = [d.usage.prompt_tokens for d in done]
    assert abs(counts[0] - counts[1]) <= 2, counts                      # "Question 0" vs "Question 1"
    for d in done:
        evoke = figures(d)
        assert d.usage.prompt_tokens == evoke["cached"] + evoke["decoded"] + evoke["reused"]
    metrics = httpx.get(server.address.removesuffix("/v1") + "/metrics", timeout=30).text
    total = {name: int(float(re.search(rf"^evoke_{name}_total (\S+)$", metrics, re.M).group(1)))
             for name in ("prompt_tokens", "cached_tokens", "decoded_tokens", "reused_tokens")}
    assert total["prompt_tokens"] == total["cached_tokens"] + total["decoded_tokens"] + total["reused_tokens"]


# -- item 5: strict json_schema -------------------------------------------------------------------------------------
BOUNDED = {"type": "json_schema", "json_schema": {"name": "pick", "strict": True, "schema": {
    "type": "object", "properties": {"n": {"type": "integer", "minimum": 100, "maximum": 105},
                                     "m": {"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 3}},
    "required": ["n", "m"], "additionalProperties": False}}}


def test_integer_bounds_hold_in_a_strict_json_schema(served):
    _, _, client = served
    for seed in range(4):
        done = client.chat.completions.create(
            model="evoke", messages=[{"role": "user", "content": "Pick two numbers, n and m."}],
            response_format=BOUNDED, temperature=1.0, seed=seed, max_tokens=40)
        picked = json.loads(done.choices[0].message.content)
        assert 100 <= picked["n"] <= 105 and -3 < picked["m"] < 3, picked


@pytest.mark.parametrize(("schema", "keyword"), [
    ({"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}}, "multipleOf"),
    ({"type": "object", "properties": {"x": {"type": "number", "maximum": 1.5}}}, "maximum"),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems")])
def test_a_keyword_the_grammar_cannot_enforce_is_a_400_naming_it(served, schema, keyword):
    _, _, client = served
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="evoke", messages=[{"role": "user", "content": "Go."}], max_tokens=8,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "x", "schema": schema}})
    assert caught.value.body["code"] == "unsupported_schema_keyword" and keyword in caught.value.body["message"]


# -- issue 57 item 7: logit_bias ------------------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [{"1000000000000": 5}, {"-5": 5}, {"49152": 5}, {"42": float("nan")},
                                  {"42": 1e308}, {"42": -101}])
@pytest.mark.parametrize("route", ["/chat/completions", "/completions"])
def test_a_logit_bias_outside_the_vocabulary_or_range_is_a_400(served, bias, route):
    engine, server, _ = served
    body = {"model": "evoke", "max_tokens": 2, "logit_bias": bias,
            **({"messages": [{"role": "user", "content": "Hi"}]} if route == "/chat/completions" else {"prompt": "Hi"})}
    response = httpx.post(server.address + route, content=json.dumps(body), timeout=60,
                          headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "logit_bias"
    fine = httpx.post(server.address + route, json={**body, "logit_bias": {"42": -100}}, timeout=120)
    assert fine.status_code == 200, fine.text
