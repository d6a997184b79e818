"""The endpoint's OpenAI dialect without the model: which fields are refused by name, which constraint a request
asks for (and the grammar llama.cpp gets), usage split from Evoke's figures, the overflow wording, /metrics text."""

from __future__ import annotations

import re

import pytest

from evoke_engine.server.app import split_usage
from evoke_engine.server.constraints import grammar_for
from evoke_engine.server.errors import ApiError
from evoke_engine.server.metrics import Metrics
from evoke_engine.server.models import ChatRequest

TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}


def request(**fields) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": "hi"}], **fields)


@pytest.mark.parametrize(("fields", "named"), [({"functions": [{"name": "f"}]}, "functions"),
                                               ({"audio": {"voice": "x"}}, "audio"),
                                               ({"logprobs": True, "stream": True}, "logprobs"),
                                               ({"top_logprobs": 2}, "top_logprobs")])
def test_refused_fields_are_named(fields, named):
    assert named in request(**fields).refusal()


def test_supported_and_unknown_fields_are_not_refused():
    req = request(logprobs=True, top_logprobs=2, top_k=5, min_p=0.1, presence_penalty=1, frequency_penalty=1,
                  logit_bias={"17": -100}, parallel_tool_calls=True, vendor_thing=1, modalities=["text"])
    assert req.refusal() is None
    sampling = req.sampling(64)
    assert sampling["logprobs"] == 2 and sampling["top_k"] == 5 and sampling["logit_bias"] == [(17, -100.0)]


def test_grammars_and_conflicts():
    assert grammar_for(request()) is None
    assert grammar_for(request(response_format={"type": "text"})) is None
    for req in (request(response_format={"type": "json_object"}),
                request(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
                    "type": "object", "properties": {"a": {"type": "integer"}}}}}),
                request(tools=[TOOL], tool_choice="required")):
        grammar = grammar_for(req)
        assert re.search(r"^root\s*::=", grammar, re.M)     # llama.cpp runs them: the integration tests
    assert '"<tool_call>"' in grammar_for(request(tools=[TOOL], tool_choice="required"))
    with pytest.raises(ApiError, match="send one"):
        grammar_for(request(response_format={"type": "json_object"}, grammar='root ::= "a"'))
    with pytest.raises(ApiError, match="not among the declared tools"):
        grammar_for(request(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}))


def test_usage_keeps_openai_fields_only():
    usage, figures = split_usage({"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12,
                                  "evoke": {"cached": 7, "decoded": 3}})
    assert usage == {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12,
                     "prompt_tokens_details": {"cached_tokens": 7}}
    assert figures == {"cached": 7, "decoded": 3}


def test_metrics_text():
    metrics = Metrics()
    metrics.observe({"prompt_tokens": 10, "completion_tokens": 2}, {"cached": 7, "engine_ttft_ms": 300})
    text = metrics.render({"model_loaded": ("loaded", 1.0)}, None)
    assert "evoke_cached_tokens_total 7" in text and 'evoke_time_to_first_token_seconds_bucket{le="0.25"} 0' in text
    assert 'evoke_time_to_first_token_seconds_bucket{le="0.5"} 1' in text and "evoke_kv_disk_bytes 0" in text
