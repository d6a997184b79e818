"""Issue 58's clients test: the real `openai` and `litellm` libraries against the endpoint (`serve`, embedded model).
Each check is what the client sees: stops never leak, usage counts, cut calls, embeddings, litellm's errors; offline."""

from __future__ import annotations

import os
import socket

import httpx
import numpy as np
import openai
import pytest
from helpers.server_fixtures import client_for, running_server
from jinja2.sandbox import ImmutableSandboxedEnvironment

from evoke_engine.server.api_errors import context_tokens

KEY = "clients-key-58"
COUNT = [{"role": "user", "content": "Count from 1 to 10, one number per line, like '1. 1'."}]
REPLY_TOKENS = 32
WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"type": "string"}}, "required": ["city"]}}}]
TOOL_MARKUP = ("<tool_call", "</tool_call", '"name"', '"arguments"', "get_weather")
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("clients"), api_key=KEY) as (engine, server):
        client = client_for(server, api_key=KEY)
        client.chat.completions.create(model="evoke", messages=[{"role": "user", "content": "Hi."}], max_tokens=2,
                                       temperature=0)                # the shared system prompt warm for every test
        yield engine, server, client


def route(server, path: str) -> str:
    return server.address.removesuffix("/v1") + path


def token_pieces(server, text: str) -> list[str]:
    """`text` as the model's tokens, through llama-server's /tokenize (the pieces spell `text` again)."""
    reply = httpx.post(route(server, "/tokenize"), json={"content": text, "with_pieces": True}, timeout=60,
                       headers={"Authorization": f"Bearer {KEY}"})
    assert reply.status_code == 200, reply.text
    pieces = [token["piece"] for token in reply.json()["tokens"]]
    assert all(isinstance(piece, str) for piece in pieces) and "".join(pieces) == text, pieces
    return pieces


def leaked_start(content: str, stop: str) -> str:
    """The longest start of `stop` that `content` ends with ("" when none)."""
    return next((stop[:k] for k in range(len(stop), 0, -1) if content.endswith(stop[:k])), "")


# -- stop strings of several tokens ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def counting(served):
    """(the greedy reply without a stop, {kind: stop}): two stops from the reply's first half, each spanning three
    of its tokens, one starting where a token starts and one inside a token, each first met where it was taken."""
    _, server, client = served
    text = client.chat.completions.create(model="evoke", messages=COUNT, max_tokens=REPLY_TOKENS,
                                          temperature=0).choices[0].message.content
    pieces = token_pieces(server, text)
    assert len(pieces) >= 16, text
    starts = np.cumsum([0, *map(len, pieces)]).tolist()
    stops: dict[str, str] = {}
    for i in range(2, len(pieces) // 2):
        candidates = {"at a token's start": starts[i]}
        if len(pieces[i].strip()) >= 2:
            candidates["inside a token"] = starts[i] + len(pieces[i]) - len(pieces[i].lstrip()) + 1
        for kind, at in candidates.items():
            stop = text[at:starts[i + 3]]
            if kind not in stops and stop.strip() and text.find(stop) == at and not leaked_start(text[:at], stop):
                stops[kind] = stop
    assert set(stops) == {"at a token's start", "inside a token"}, (text, pieces)
    return text, stops


def before_stop(text: str, stop: str) -> str:
    return text[:text.find(stop)]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", ["at a token's start", "inside a token"])
def test_openai_a_stop_of_several_tokens_never_leaks_into_the_reply(served, counting, kind, stream):
    _, _, client = served
    text, stops = counting
    stop = stops[kind]
    ask = dict(model="evoke", messages=COUNT, max_tokens=REPLY_TOKENS, temperature=0, stop=[stop])
    if stream:
        content, finish = "", None
        for chunk in client.chat.completions.create(**ask, stream=True):
            if chunk.choices:
                content += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
    else:
        choice = client.chat.completions.create(**ask).choices[0]
        content, finish = choice.message.content, choice.finish_reason
    assert stop not in content and not leaked_start(content, stop), (content, stop)
    assert content == before_stop(text, stop), (content, stop, text)      # the unstopped reply, up to the stop
    assert finish == "stop"


# -- usage -------------------------------------------------------------------------------------------------------------
def new_system_prompt() -> dict:
    """A system message no request has sent before, none of its sentences either."""
    tag = os.urandom(6).hex()
    return {"role": "system", "content": f"You are assistant {tag}. " + " ".join(
        f"Rule {i} of {tag}: answer briefly and precisely." for i in range(6))}


def rendered_tokens(server, messages: list[dict], *, generation_prompt: bool) -> int:
    """How many tokens the model's own chat template (from /props) makes of `messages`, as a llama-server client
    counts them."""
    props = httpx.get(route(server, "/props"), headers={"Authorization": f"Bearer {KEY}"}, timeout=60).json()
    template = ImmutableSandboxedEnvironment().from_string(props["chat_template"])
    return len(token_pieces(server, template.render(messages=messages, add_generation_prompt=generation_prompt)))


def test_openai_usage_of_a_new_system_prompt_is_all_decoded_none_cached(served):
    _, server, client = served
    system = new_system_prompt()
    messages = [system, {"role": "user", "content": "Say hi."}]
    done = client.chat.completions.create(model="evoke", messages=messages, max_tokens=4, temperature=0)
    assert done.usage.prompt_tokens_details.cached_tokens == 0
    assert done.model_extra["evoke"]["decoded"] == done.usage.prompt_tokens          # decoded for this request
    assert done.usage.prompt_tokens > rendered_tokens(server, [system], generation_prompt=False)
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens


def test_openai_prompt_tokens_are_every_token_of_the_rendered_prompt(served):
    _, server, client = served
    messages = [new_system_prompt(), {"role": "user", "content": "Say hi."}]
    done = client.chat.completions.create(model="evoke", messages=messages, max_tokens=4, temperature=0)
    assert done.usage.prompt_tokens == rendered_tokens(server, messages, generation_prompt=True)


def test_openai_usage_of_a_re_sent_prompt_counts_the_same_and_caches_only_what_was_not_decoded(served):
    _, server, client = served
    system = new_system_prompt()
    asks = [[system, {"role": "user", "content": text}] for text in ("Say hi.", "Say hi.", "Name three rivers.")]
    done = [client.chat.completions.create(model="evoke", messages=messages, max_tokens=4, temperature=0)
            for messages in asks]
    system_tokens = rendered_tokens(server, [system], generation_prompt=False)
    first, again, new_question = done
    assert again.usage.prompt_tokens == first.usage.prompt_tokens
    for reply in (again, new_question):
        cached, evoke = reply.usage.prompt_tokens_details.cached_tokens, reply.model_extra["evoke"]
        assert cached >= system_tokens                                       # the system prompt was sent before
        assert cached == reply.usage.prompt_tokens - evoke["decoded"] - evoke["reused"]
    question = rendered_tokens(server, asks[2], generation_prompt=False) - system_tokens
    assert new_question.model_extra["evoke"]["decoded"] >= question          # a new message is never cached
    assert new_question.usage.prompt_tokens_details.cached_tokens <= new_question.usage.prompt_tokens - question


# -- a tool call cut by max_tokens -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def whole_call(served):
    """The uncut call's request and its length in tokens."""
    _, _, client = served
    ask = dict(model="evoke", messages=[{"role": "user", "content": "What is the weather in Paris?"}], tools=WEATHER,
               tool_choice="required", temperature=0)
    done = client.chat.completions.create(**ask, max_tokens=64)
    assert done.choices[0].finish_reason == "tool_calls" and done.choices[0].message.tool_calls
    return ask, done.usage.completion_tokens


def test_openai_a_streamed_call_is_the_whole_replys_call(served, whole_call):
    """A forced call streamed (id and name first, then arguments pieces) and accumulated by openai-python's stream
    helper is the call of the same greedy request answered whole."""
    _, _, client = served
    ask, tokens = whole_call
    whole = client.chat.completions.create(**ask, max_tokens=64).choices[0].message.tool_calls
    with client.chat.completions.stream(**ask, max_tokens=64) as stream:
        argument_pieces = [event for event in stream if event.type == "tool_calls.function.arguments.delta"]
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls" and len(argument_pieces) > 1
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in whole]
    assert all(c.id.startswith("call_") for c in final.message.tool_calls)


@pytest.mark.parametrize("cut", [
    "after its first token", "halfway", "before its last token"])
def test_openai_a_tool_call_cut_by_max_tokens_is_length_with_no_markup(served, whole_call, cut):
    _, _, client = served
    ask, tokens = whole_call
    max_tokens = {"after its first token": 1, "halfway": tokens // 2, "before its last token": tokens - 1}[cut]
    choice = client.chat.completions.create(**ask, max_tokens=max_tokens).choices[0]
    seen = {"whole": (choice.message.content or "", choice.finish_reason, bool(choice.message.tool_calls))}
    content, finish, calls = "", None, False
    for chunk in client.chat.completions.create(**ask, max_tokens=max_tokens, stream=True):
        if chunk.choices:
            content += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
            calls = calls or bool(chunk.choices[0].delta.tool_calls)
    seen["streamed"] = (content, finish, calls)
    for way, (content, finish, calls) in seen.items():
        assert finish == "length" and (way == "streamed" or not calls), seen    # a stream may have opened the call
        assert not content.strip() and not any(mark in content for mark in TOOL_MARKUP), seen   # (docs/endpoint.md)


# -- token-id embeddings -----------------------------------------------------------------------------------------------
def embedder_tokenizer(engine):
    """The embedder's own tokenizer (`tokenizers.Tokenizer`): the vocabulary token-id input is read in."""
    return engine.thread.call(lambda: engine.ensure_model().embedder._load().tokenizer)


def unit_rows(data) -> np.ndarray:
    rows = np.asarray([item.embedding for item in data], dtype=np.float32)
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-3)
    return rows


def test_openai_token_id_embeddings_are_the_texts_the_ids_spell(served):
    engine, _, client = served
    tokenizer = embedder_tokenizer(engine)
    texts = ["a cat sat on the mat", "tax law in the netherlands"]
    ids = [tokenizer.encode(text).ids for text in texts]
    by_text = unit_rows(client.embeddings.create(model="evoke", input=texts).data)
    one = client.embeddings.create(model="evoke", input=ids[0])                  # a list of ints: one input
    many = client.embeddings.create(model="evoke", input=ids)                    # a list of lists
    assert [item.index for item in many.data] == [0, 1] and len(one.data) == 1
    assert float(unit_rows(one.data)[0] @ by_text[0]) > 0.999
    assert np.min(np.sum(unit_rows(many.data) * by_text, axis=1)) > 0.999
    assert many.usage.prompt_tokens == sum(map(len, ids))


def test_openai_an_id_outside_the_embedders_vocabulary_is_a_400(served):
    engine, server, client = served
    size = embedder_tokenizer(engine).get_vocab_size()
    chat_model_has = httpx.post(route(server, "/detokenize"), json={"tokens": [size]}, timeout=60,
                                headers={"Authorization": f"Bearer {KEY}"})
    assert chat_model_has.status_code == 200, chat_model_has.text          # only the embedder lacks it
    assert len(client.embeddings.create(model="evoke", input=[101, size - 1, 102]).data) == 1
    for bad in ([101, size, 102], [[101, 102], [101, size, 102]]):
        with pytest.raises(openai.BadRequestError) as caught:
            client.embeddings.create(model="evoke", input=bad)
        assert "vocabulary" in caught.value.body["message"], caught.value.body


# -- litellm (aider's client library), unmodified and offline ---------------------------------------------------------
@pytest.fixture(scope="module")
def litellm(served):
    """litellm imported offline (its local price list) with every name lookup but loopback's refused at once, so a
    network attempt fails the module instead of hanging it; afterwards, none was made."""
    refused: list[str] = []
    lookup = socket.getaddrinfo

    def loopback_only(host, *args, **kwargs):
        if (host.decode() if isinstance(host, bytes) else str(host)) not in LOOPBACK:
            refused.append(str(host))
            raise OSError(f"the clients test is offline: no lookup of {host}")
        return lookup(host, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        patch.setattr(socket, "getaddrinfo", loopback_only)
        import litellm
        patch.setattr(litellm, "suppress_debug_info", True)
        yield litellm
    assert not refused, f"litellm tried the network: {refused}"


def through_litellm(served) -> dict:
    """litellm's OpenAI-compatible provider pointed at the endpoint, as aider configures it."""
    _, server, _ = served
    return dict(model="openai/evoke", api_base=server.address, api_key=KEY, max_retries=0)


def test_litellm_chat_whole_and_streamed_is_the_greedy_reply(served, counting, litellm):
    text, _ = counting
    ask = dict(**through_litellm(served), messages=COUNT, max_tokens=REPLY_TOKENS, temperature=0)
    done = litellm.completion(**ask)
    assert done.choices[0].message.content == text
    assert done.usage.prompt_tokens > 0 and done.usage.completion_tokens > 0
    assert done.usage.prompt_tokens_details.cached_tokens > 0        # the shared system prompt was not decoded
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in litellm.completion(**ask, stream=True)
                       if chunk.choices)
    assert streamed == text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_litellm_a_stop_of_several_tokens_never_leaks(served, counting, litellm, stream):
    text, stops = counting
    stop = stops["inside a token"]
    ask = dict(**through_litellm(served), messages=COUNT, max_tokens=REPLY_TOKENS, temperature=0, stop=[stop])
    if stream:
        content = "".join(chunk.choices[0].delta.content or "" for chunk in litellm.completion(**ask, stream=True)
                          if chunk.choices)
    else:
        content = litellm.completion(**ask).choices[0].message.content
    assert not leaked_start(content, stop) and content == before_stop(text, stop), (content, stop)


def test_litellm_maps_an_over_long_prompt_to_a_context_window_error(served, litellm):
    engine, _, _ = served
    words = "word " * (context_tokens(engine.settings) + 16)
    with pytest.raises(litellm.ContextWindowExceededError):             # aider says the context is full on this
        litellm.completion(**through_litellm(served), messages=[{"role": "user", "content": words}], max_tokens=4)
    after = litellm.completion(**through_litellm(served), messages=[{"role": "user", "content": "Hi."}], max_tokens=4)
    assert after.choices[0].message.content


def test_litellm_embeddings_are_the_endpoints_vectors(served, litellm):
    _, _, client = served
    texts = ["a cat sat on the mat", "tax law in the netherlands"]
    done = litellm.embedding(**through_litellm(served), input=texts)
    rows = np.asarray([item["embedding"] for item in done.data], dtype=np.float32)
    by_openai = unit_rows(client.embeddings.create(model="evoke", input=texts).data)
    assert rows.shape == by_openai.shape and np.min(np.sum(rows * by_openai, axis=1)) > 0.999
