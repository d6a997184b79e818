"""Issue 60: the grammar that forces a tool call (tool_choice required or named) parses in llama.cpp for every
format, accepts a call written in that format token by token (then lets the reply end), and refuses a call to an
undeclared tool; the call it accepts is the one `parse_tool_calls` reads. Only the embedded model's vocabulary is
loaded (`vocab_only`)."""

from __future__ import annotations

import ctypes
import json

import llama_cpp as ll
import pytest

from evoke_engine.runtime.model_file import default_model_path
from evoke_engine.runtime.runtime import quiet_llama_logs, safe_model_params
from evoke_engine.runtime.tokens import tokenize_with
from evoke_engine.server.constraints import grammar_for
from evoke_engine.server.request_bodies import ChatRequest
from evoke_engine.server.toolcall_formats import FORMATS, ParsedCall, format_named
from evoke_engine.server.toolcalls import parse_tool_calls

TOOLS = [{"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city"]}}},
         {"type": "function", "function": {
             "name": "grep", "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}},
                                            "required": ["pattern"]}}}]
NAMES = {"get_weather", "grep"}
# a call each format's grammar must accept (the spacing its JSON rules allow), and one it must refuse
SAMPLES = {
    "hermes": ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>',
               '<tool_call>{"name": "rm", "arguments": {}}</tool_call>'),
    "llama3": ('{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}',
               '{"name": "get_weather", "parameters": {"city": "Paris", "days": 9}}'),
    "mistral": ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}, "id": "abcDEF123"}]',
                '[TOOL_CALLS][{"name": "get_weather", "arguments": {"town": "Paris"}}]'),
    "mistral_args": ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}',
                     '[TOOL_CALLS]rm[ARGS]{}'),
}
CALL = ParsedCall("get_weather", json.dumps({"city": "Paris", "days": 2}, sort_keys=True))


@pytest.fixture(scope="module")
def vocab():
    quiet_llama_logs()
    params = safe_model_params()
    params.vocab_only = True
    model = ll.llama_model_load_from_file(str(default_model_path()).encode(), params)
    assert model
    yield ll.llama_model_get_vocab(model)
    ll.llama_model_free(model)


def allowed(sampler, token: int) -> bool:
    """Whether the grammar sampler lets `token` through now (its logit stays finite)."""
    data = (ll.llama_token_data * 1)(ll.llama_token_data(token, 0.0, 0.0))
    candidates = ll.llama_token_data_array(data, 1, -1, False)
    ll.llama_sampler_apply(sampler, ctypes.byref(candidates))
    return data[0].logit > float("-inf")


def accepts(vocab, grammar: str, text: str) -> bool:
    """Whether `grammar` takes `text`'s tokens one by one and then lets the reply end (an end-of-generation token)."""
    sampler = ll.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    assert sampler, "llama.cpp did not parse the grammar"
    try:
        for token in tokenize_with(vocab, text, False, False):
            if not allowed(sampler, token):
                return False
            ll.llama_sampler_accept(sampler, token)
        return allowed(sampler, ll.llama_vocab_eos(vocab))
    finally:
        ll.llama_sampler_free(sampler)


def forced(name: str, tool_choice="required") -> str:
    request = ChatRequest(messages=[{"role": "user", "content": "hi"}], tools=TOOLS, tool_choice=tool_choice)
    return grammar_for(request, format_named(name))


@pytest.mark.parametrize("name", list(FORMATS))
def test_the_forcing_grammar_parses_and_accepts_a_call_in_its_format(vocab, name):
    good, bad = SAMPLES[name]
    grammar = forced(name)
    assert accepts(vocab, grammar, good)
    assert not accepts(vocab, grammar, bad)
    assert not accepts(vocab, grammar, "Sure, here is the weather.")
    assert parse_tool_calls(good, NAMES, format_named(name)) == (None, [CALL])


@pytest.mark.parametrize("name", list(FORMATS))
def test_a_named_tool_choice_accepts_that_tool_only(vocab, name):
    grammar = forced(name, {"type": "function", "function": {"name": "grep"}})
    good = SAMPLES[name][0]
    assert not accepts(vocab, grammar, good)                 # a call to get_weather
    grep = good.replace("get_weather", "grep").replace('"city": "Paris", "days": 2', '"pattern": "TODO"')
    assert accepts(vocab, grammar, grep)
