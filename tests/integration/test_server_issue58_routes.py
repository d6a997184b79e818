"""Issue 58 item 10, routes other tools call, on the real embedded model: OpenAI's Responses API through the `openai`
client (text, the streamed events, a function tool's round trip continued by `previous_response_id` in the same
conversation, refusals naming the field), and llama-server's /infill, /tokenize, /detokenize and /props."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import openai
import pytest
from helpers.server_fixtures import client_for, running_server

from evoke_engine import Settings
from evoke_engine.server.api_errors import context_tokens
from evoke_engine.server.llama_routes import MAX_TOKENIZE_CHARS, SNIPPET_SEPARATOR, InfillRequest, infill_tokens
from evoke_engine.server.responses_api import input_messages

WEATHER = [{"type": "function", "name": "get_weather", "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
FORCED = {"type": "function", "name": "get_weather"}
TEXT_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
               "response.content_part.added", "response.output_text.delta", "response.output_text.done",
               "response.content_part.done", "response.output_item.done"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("issue58_routes")) as (engine, server):
        yield engine, server, client_for(server)


def base(server) -> str:
    return server.address.removesuffix("/v1")


def evoke(response) -> dict:
    return response.model_extra["evoke"]


# -- /v1/responses ---------------------------------------------------------------------------------------------------
def test_a_text_response_with_usage(served):
    _, _, client = served
    done = client.responses.create(model="evoke", input="What is the capital of France?",
                                   instructions="Answer in one word.", max_output_tokens=16, temperature=0)
    assert done.object == "response" and done.id.startswith("resp_") and done.status in ("completed", "incomplete")
    assert done.output[0].type == "message" and done.output_text.strip()
    usage = done.usage
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert 0 <= usage.input_tokens_details.cached_tokens <= usage.input_tokens
    cut = client.responses.create(model="evoke", input="Count from one to fifty.", max_output_tokens=2)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"


def test_streamed_events_in_order_and_the_same_text(served):
    _, _, client = served
    ask = dict(model="evoke", input=[{"role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}],
               max_output_tokens=12, temperature=0)
    whole = client.responses.create(**ask)
    events = list(client.responses.create(**ask, stream=True))
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]] == [*TEXT_EVENTS, events[-1].type]
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done_text = next(e.text for e in events if e.type == "response.output_text.done")
    assert "".join(deltas) == done_text == events[-1].response.output_text == whole.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens


def test_a_forced_function_call_round_trip_continues_the_conversation(served):
    engine, _, client = served
    first = client.responses.create(model="evoke", input="What is the weather in Paris?", tools=WEATHER,
                                    tool_choice=FORCED, max_output_tokens=64, temperature=0)
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    assert isinstance(json.loads(calls[0].arguments).get("city"), str)
    second = client.responses.create(model="evoke", previous_response_id=first.id, tools=WEATHER,
                                     max_output_tokens=24, temperature=0,
                                     input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                             "output": '{"temperature_c": 21, "sky": "clear"}'}])
    assert second.previous_response_id == first.id and second.output_text is not None
    assert evoke(second)["conversation_id"] == evoke(first)["conversation_id"]
    assert evoke(second)["route"] == "continue"
    messages = engine.open_conversation(evoke(first)["conversation_id"]).messages()
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert "temperature_c" in messages[2]["text"]
    third = client.responses.create(model="evoke", previous_response_id=second.id, tools=WEATHER,
                                    input="Thanks. And in Rome?", max_output_tokens=8, temperature=0)
    assert evoke(third)["conversation_id"] == evoke(first)["conversation_id"]
    assert evoke(third)["decoded"] < evoke(third)["cached"]          # only the new input was decoded


def test_a_streamed_function_call_has_its_argument_events(served):
    """A forced call streams as OpenAI's Responses API does (the item with its call_id and name, its arguments in
    pieces as written, then done), equals the same greedy request answered whole, and its call_id maps back."""
    _, _, client = served
    ask = dict(model="evoke", input="Weather in Oslo?", tools=WEATHER, tool_choice=FORCED, max_output_tokens=64,
               temperature=0)
    whole = client.responses.create(**ask)
    events = list(client.responses.create(**ask, stream=True))
    kinds = [e.type for e in events]
    assert kinds[-1] == "response.completed"
    added = next(e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call")
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    item_done = next(e for e in events if e.type == "response.output_item.done" and e.item.type == "function_call")
    assert kinds.index(added.type) < events.index(deltas[0]) < events.index(done) < events.index(item_done)
    assert added.item.name == "get_weather" and added.item.arguments == "" and added.item.call_id
    assert len(deltas) > 1 and "".join(d.delta for d in deltas) == done.arguments == item_done.item.arguments
    assert {d.item_id for d in deltas} == {added.item.id, done.item_id}
    final = events[-1].response.output[-1]
    assert (final.type, final.id, final.call_id) == ("function_call", added.item.id, added.item.call_id)
    assert final.arguments == done.arguments and final.status == "completed"
    assert [(i.type, i.name, i.arguments) for i in whole.output] == [("function_call", final.name, final.arguments)]
    streamed_conversation = events[-1].response.model_extra["evoke"]["conversation_id"]
    again = client.responses.create(model="evoke", tools=WEATHER, max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"type": "function_call", "call_id": final.call_id, "name": final.name, "arguments": final.arguments},
        {"type": "function_call_output", "call_id": final.call_id, "output": '{"sky": "clear"}'}])
    assert evoke(again)["route"] == "continue"       # the call re-sent is the model's own text: nothing re-decoded
    assert evoke(again)["conversation_id"] in (streamed_conversation, evoke(whole)["conversation_id"])


def test_previous_response_id_continues_and_store_false_is_not_kept(served):
    _, server, client = served
    first = client.responses.create(model="evoke", input="My name is Ada.", max_output_tokens=8, temperature=0)
    anyone = client_for(server)                       # another client token: the id alone is not its
    with pytest.raises(openai.BadRequestError) as caught:
        anyone.responses.create(model="evoke", input="What is my name?", previous_response_id=first.id,
                                max_output_tokens=8)
    assert caught.value.body["code"] == "previous_response_not_found"
    tokenless = httpx.post(server.address + "/responses", timeout=120,
                           json={"model": "evoke", "input": "What is my name?", "previous_response_id": first.id,
                                 "max_output_tokens": 8})
    assert tokenless.status_code == 200          # without a token, the response id is the credential
    assert tokenless.json()["evoke"]["conversation_id"] == evoke(first)["conversation_id"]
    unstored = client.responses.create(model="evoke", input="Hi.", max_output_tokens=4, store=False)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="evoke", input="Again.", previous_response_id=unstored.id, max_output_tokens=4)
    assert caught.value.body["param"] == "previous_response_id"


@pytest.mark.parametrize(("fields", "param"), [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[0].type"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"background": True}, "background"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"text": {"format": {"type": "json_schema", "name": "n", "strict": True,
                          "schema": {"type": "number", "multipleOf": 3}}}}, "text.format"),
])
def test_what_the_endpoint_cannot_honour_is_a_400_naming_it(served, fields, param):
    _, _, client = served
    body = {"model": "evoke", "input": "Hi.", "max_output_tokens": 4, **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(**body)
    assert caught.value.body["param"] == param and caught.value.body["type"] == "invalid_request_error"


def test_input_items_become_chat_messages():
    items = [{"type": "message", "role": "developer", "content": "Be brief."},
             {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Calling."}]},
             {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
             {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": "{\"x\": 1}"},
             {"type": "function_call_output", "call_id": "call_1", "output": "one"},
             {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "two"}]}]
    messages = input_messages(items)
    assert [m["role"] for m in messages] == ["developer", "user", "assistant", "tool", "tool"]
    assert messages[1]["content"] == "a\nb" and messages[2]["content"] == "Calling."
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["call_1", "call_2"]
    assert messages[4] == {"role": "tool", "tool_call_id": "call_2", "content": "two"}


# -- llama-server's routes -------------------------------------------------------------------------------------------
def test_tokenize_and_detokenize_round_trip(served):
    engine, server, _ = served
    text = "Hello wörld, <|im_start|> here"
    plain = httpx.post(base(server) + "/tokenize", json={"content": text}, timeout=30).json()["tokens"]
    assert plain == engine.tokenize(text, special=True)
    pieces = httpx.post(base(server) + "/tokenize", json={"content": text, "with_pieces": True}, timeout=30).json()
    assert [p["id"] for p in pieces["tokens"]] == plain
    assert "".join(p["piece"] if isinstance(p["piece"], str) else bytes(p["piece"]).decode("latin-1")
                   for p in pieces["tokens"]) == text
    back = httpx.post(base(server) + "/detokenize", json={"tokens": plain}, timeout=30).json()
    assert back == {"content": text}


def test_tokenize_and_detokenize_refuse_bad_and_huge_input(served):
    _, server, _ = served
    bad = httpx.post(base(server) + "/detokenize", json={"tokens": [1, 10**8]}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    huge = httpx.post(base(server) + "/tokenize", json={"content": "a" * (MAX_TOKENIZE_CHARS + 1)}, timeout=30)
    assert huge.status_code == 413 and huge.json()["error"]["param"] == "content"


def test_props_describe_the_loaded_model(served):
    engine, server, _ = served
    props = httpx.get(base(server) + "/props", timeout=30).json()
    assert props["default_generation_settings"]["n_ctx"] == context_tokens(engine.settings)
    assert props["total_slots"] == engine.settings.slots
    assert props["model_path"].endswith(".gguf") and "<|im_start|>" in props["chat_template"]
    assert props["build_info"].startswith("evoke-desk") and props["infill"] is False
    refused = httpx.post(base(server) + "/props", json={}, timeout=30)      # llama-server's settings change
    assert refused.status_code == 405 and "error" in refused.json()


def test_infill_without_fim_tokens_names_the_completions_route(served):
    _, server, _ = served
    refused = httpx.post(base(server) + "/infill", json={"input_prefix": "def add(a, b):\n    return ",
                                                         "input_suffix": "\n", "n_predict": 8}, timeout=30)
    assert refused.status_code == 501
    assert "/v1/completions" in refused.json()["error"]["message"]


class FimVocab:
    """The served vocabulary with a fill-in-the-middle layout of plain text (SmolLM2 has no FIM tokens)."""

    def __init__(self, vocab) -> None:
        self.vocab = vocab

    def __getattr__(self, name):
        return getattr(self.vocab, name)

    def infill(self, prefix: str, suffix: str) -> list[int]:
        return self.vocab.tokenize(f"<suffix>{suffix}</suffix>\n{prefix}", add_special=True, parse_special=False)


def test_infill_serves_llama_servers_shape_whole_and_streamed(served, monkeypatch):
    _, server, _ = served
    service = server.app.state.service
    real = service.vocabulary()
    monkeypatch.setattr(service, "vocabulary", lambda: FimVocab(real))
    body = {"input_prefix": "numbers = [1, 2, 3, ", "input_suffix": "]\n", "prompt": "", "n_predict": 6,
            "temperature": 0.0, "input_extra": [{"filename": "a.py", "text": "x = 1\n"}]}
    whole = httpx.post(base(server) + "/infill", json=body, timeout=120).json()
    assert whole["stop"] is True and isinstance(whole["content"], str) and whole["tokens_predicted"] <= 6
    assert whole["timings"]["predicted_n"] == whole["tokens_predicted"] and whole["tokens_evaluated"] > 0
    with httpx.stream("POST", base(server) + "/infill", json={**body, "stream": True}, timeout=120) as streamed:
        lines = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: ")]
    assert all(not line["stop"] for line in lines[:-1]) and lines[-1]["stop"] is True
    assert "".join(line["content"] for line in lines) == whole["content"]


def test_infill_extra_context_is_dropped_oldest_first_to_fit():
    vocab = SimpleNamespace(infill=lambda prefix, suffix: list(range(len(prefix) + len(suffix))))
    service = SimpleNamespace(vocabulary=lambda: vocab, prefill_limit=lambda: 10_000)
    engine = SimpleNamespace(settings=Settings(n_ctx=4096, slots=2, max_tokens=512))
    room = context_tokens(engine.settings)
    old, new = "o" * (room - 100), "n" * (room // 8)      # both together do not fit, the newer alone does
    request = InfillRequest(input_prefix="ab", input_suffix="c", n_predict=16,
                            input_extra=[{"filename": "old.py", "text": old}, {"filename": "new.py", "text": new}])
    tokens, max_tokens = infill_tokens(engine, service, request)
    expected = f"{SNIPPET_SEPARATOR}new.py\n{new}{SNIPPET_SEPARATOR}ab"
    assert max_tokens == 16 and len(tokens) == len(expected) + 1
