"""The endpoint's OpenAI dialect without the model: which fields are refused by name, which constraint a request
asks for (and the grammar llama.cpp gets), usage split from Evoke's figures, the overflow wording, /metrics text."""

from __future__ import annotations

import re

import pytest

from evoke_engine import Settings
from evoke_engine.events import EngineEvent, EventKind
from evoke_engine.runtime.reply_text import ReplyText
from evoke_engine.runtime.vocab import infill_layout
from evoke_engine.server.api_errors import ApiError, aider_metadata
from evoke_engine.server.app import split_usage
from evoke_engine.server.completions import legacy_logprobs
from evoke_engine.server.constraints import grammar_for
from evoke_engine.server.metrics import Metrics
from evoke_engine.server.request_bodies import ChatRequest, CompletionRequest

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


def test_metrics_count_the_engines_restores_and_spills():
    metrics = Metrics()
    metrics.on_event(EngineEvent(EventKind.KV_RESTORED, "restored", conversation_id="c", tokens=900))
    metrics.on_event(EngineEvent(EventKind.KV_RESTORED, "restored", conversation_id="d", tokens=100))
    metrics.on_event(EngineEvent(EventKind.SPILLED, "spilled", tokens=64))
    metrics.on_event(EngineEvent(EventKind.TURN_DONE, "done", tokens=5))         # not a counted kind
    text = metrics.render({"pool_ram_bytes": ("pool", 4096.0)}, None)
    assert "evoke_restores_total 2" in text and "evoke_restores_tokens_total 1000" in text
    assert "evoke_spills_total 1" in text and "evoke_rebuilds_total 0" in text and "evoke_pool_ram_bytes 4096" in text


def test_infill_layout_is_llama_servers():
    assert infill_layout(5, 6, 7, 1, [10, 11], [20]) == [1, 5, 10, 11, 6, 20, 7]
    assert infill_layout(5, 6, 7, -1, [10], []) == [5, 10, 6, 7]             # no BOS where the model adds none
    assert infill_layout(-1, -1, -1, 1, [10], [20]) is None                   # SmolLM2: no FIM tokens


def test_reply_text_holds_back_the_start_of_a_stop_and_joins_utf8():
    pieces = {1: b"Hello, wo", 2: b"rld\nEND", 3: b"\xe2\x82", 4: b"\xac", 5: b"wonder"}
    text = ReplyText(pieces.__getitem__, stops=["world"])
    assert text.add(1) == ("Hello, ", False)              # "wo" may start the stop: held back
    assert text.add(2) == ("", True) and text.text == "Hello, "
    other = ReplyText(pieces.__getitem__, stops=["world"])
    assert other.add(1) == ("Hello, ", False) and other.add(5) == ("wowonder", False)   # not the stop after all
    held = ReplyText(pieces.__getitem__, stops=["world"])
    held.add(1)
    assert held.finish() == "wo" and held.text == "Hello, wo"          # the reply ended: what was held goes out
    turn = ReplyText(pieces.__getitem__, stops=["world"], hold_back=False)     # a chat turn: the KV's own text
    assert turn.add(1) == ("Hello, wo", False) and turn.add(2) == ("", True) and turn.text == "Hello, wo"
    plain = ReplyText(pieces.__getitem__, hold_back=False)
    assert plain.add(1) == ("Hello, wo", False) and plain.add(2) == ("rld\nEND", False)
    euro = ReplyText(pieces.__getitem__)
    assert euro.add(3) == ("", False) and euro.add(4) == ("€", False)


def test_completion_requests_refuse_what_they_cannot_honour():
    assert CompletionRequest(prompt="a", echo=True).refusal() == "echo"
    assert CompletionRequest(prompt="a", best_of=2).refusal() == "best_of"
    assert CompletionRequest(prompt=["a", "b"]).refusal().startswith("prompt")
    assert CompletionRequest(prompt=[1, 2, 3]).refusal() is None
    assert CompletionRequest(prompt=[[1, 2]]).token_ids() == [1, 2]
    assert CompletionRequest(prompt=[1, 2], suffix="x").refusal().startswith("suffix")
    assert CompletionRequest(prompt="a", logprobs=2).sampling(16) == {"max_tokens": 16, "logprobs": 2}


def test_legacy_logprobs_shape():
    reports = [{"token": "Hi", "logprob": -0.1, "top_logprobs": [{"token": "Hi", "logprob": -0.1}]},
               {"token": " there", "logprob": -0.5, "top_logprobs": []}]
    assert legacy_logprobs(reports) == {"tokens": ["Hi", " there"], "token_logprobs": [-0.1, -0.5],
                                        "top_logprobs": [{"Hi": -0.1}, {}], "text_offset": [0, 2]}


def test_aider_metadata_names_the_context_a_conversation_holds():
    settings = Settings(n_ctx=16384, slots=4, slot_layout="streams", max_tokens=512)
    info = aider_metadata(settings)["openai/evoke"]
    assert info["max_input_tokens"] == 4096 and info["max_output_tokens"] == 512
    assert info["litellm_provider"] == "openai" and info["input_cost_per_token"] == 0
    assert aider_metadata(Settings(n_ctx=8192, slots=2, slot_layout="unified"), "openai/x")["openai/x"][
        "max_input_tokens"] == 8192
