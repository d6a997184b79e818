"""`POST /v1/completions` (issue 45) through the official `openai` client on loopback and the real embedded model:
raw-text continuation, token-id prompts, legacy logprobs, streaming with usage, stop strings, a `suffix` refused with
the reason (SmolLM2 has no fill-in-the-middle tokens), overflow as OpenAI's `context_length_exceeded`, nothing stored,
and the engine's conversations unchanged by a completion run between their turns."""

from __future__ import annotations

import math

import httpx
import openai
import pytest
from helpers.server_fixtures import client_for, running_server


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("completions")) as (engine, server):
        yield engine, server, client_for(server)


def test_a_prompt_is_continued_as_raw_text(served):
    _, _, client = served
    done = client.completions.create(model="evoke", prompt="def fibonacci(n):\n", max_tokens=24, temperature=0)
    choice = done.choices[0]
    assert done.object == "text_completion" and choice.text.strip()
    assert choice.finish_reason == "length" and done.usage.completion_tokens == 24
    assert done.usage.prompt_tokens > 0 and done.usage.total_tokens == done.usage.prompt_tokens + 24
    again = client.completions.create(model="evoke", prompt="def fibonacci(n):\n", max_tokens=24, temperature=0)
    assert again.choices[0].text == choice.text          # greedy and stateless: the same text twice


def test_token_ids_and_text_give_the_same_continuation(served):
    engine, _, client = served
    text = "The capital of France is"
    ids = engine.tokenize(text, special=True)
    by_text = client.completions.create(model="evoke", prompt=text, max_tokens=6, temperature=0)
    by_ids = client.completions.create(model="evoke", prompt=ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        client.completions.create(model="evoke", prompt=[1, 2, 10**8], max_tokens=4)


def test_legacy_logprobs_are_probabilities(served):
    _, _, client = served
    done = client.completions.create(model="evoke", prompt="One, two, three,", max_tokens=5, temperature=0,
                                     logprobs=3, extra_body={"repeat_penalty": 1.0})   # the raw distribution
    logprobs = done.choices[0].logprobs
    assert "".join(logprobs.tokens) == done.choices[0].text
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)
    for chosen, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert chosen <= 0 and len(top) == 3
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-6
        assert chosen == pytest.approx(max(top.values()))        # greedy, no penalty: the most likely


def test_streaming_with_usage_and_a_stop_string(served):
    _, _, client = served
    plain = client.completions.create(model="evoke", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0)
    stream = client.completions.create(model="evoke", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == plain.choices[0].text
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    stop = plain.choices[0].text.strip().split(",")[0].strip() or plain.choices[0].text[:2]
    stopped = client.completions.create(model="evoke", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0,
                                        stop=[stop])
    assert stop not in stopped.choices[0].text and stopped.choices[0].finish_reason == "stop"


def test_a_suffix_is_refused_with_the_reason_on_a_model_without_fim_tokens(served):
    _, _, client = served
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="evoke", prompt="def add(a, b):\n", suffix="\n    return total\n",
                                  max_tokens=8)
    error = caught.value.body
    assert error["param"] == "suffix" and "fill-in-the-middle" in error["message"]


def test_unsupported_fields_overflow_and_batches_are_400s(served):
    engine, _, client = served
    for field, value in (("echo", True), ("best_of", 3)):
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model="evoke", prompt="hi", max_tokens=2, **{field: value})
        assert caught.value.body["param"] == field
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="evoke", prompt=["one", "two"], max_tokens=2)
    assert caught.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="evoke", prompt="word " * engine.settings.n_ctx, max_tokens=4)
    assert caught.value.body["code"] == "context_length_exceeded"
    assert "This model's maximum context length is " in caught.value.body["message"]


def test_a_completion_stores_nothing_and_leaves_a_conversation_as_it_was(served):
    engine, server, client = served
    conversations = len(engine.history.list_conversations())
    chat = client.chat.completions.create(model="evoke", messages=[{"role": "user", "content": "Name a colour."}],
                                          max_tokens=8, extra_headers={"X-Evoke-Session": "between"})
    conversation_id = chat.model_extra["evoke"]["conversation_id"]
    client.completions.create(model="evoke", prompt="A long list of fruit: apple, pear,", max_tokens=40)
    engine.check(conversation_id)                         # its block table still mirrors llama.cpp's sequence
    assert len(engine.history.list_conversations()) == conversations + 1
    follow = client.chat.completions.create(
        model="evoke", max_tokens=8, extra_headers={"X-Evoke-Session": "between"},
        messages=[{"role": "user", "content": "Name a colour."}, chat.choices[0].message.model_dump(exclude_none=True),
                  {"role": "user", "content": "And another?"}])
    assert follow.model_extra["evoke"]["conversation_id"] == conversation_id
    metrics = httpx.get(server.address.removesuffix("/v1") + "/metrics", timeout=30).text
    assert "evoke_requests_total" in metrics


def test_a_request_names_its_engine_job_which_can_be_cancelled_by_id(served):
    """Issue 47: the engine thread's typed jobs: a chat request's response names the job that served it
    (`X-Evoke-Job`, in the engine's DEBUG log too), and `Engine.cancel_job` stops a running turn by that id."""
    engine, server, _ = served
    body = {"model": "evoke", "max_tokens": 4, "messages": [{"role": "user", "content": "Say hi."}]}
    first = httpx.post(server.address + "/chat/completions", json=body, timeout=60)
    assert first.status_code == 200 and int(first.headers["X-Evoke-Job"]) > 0
    long = {"model": "evoke", "max_tokens": 400, "stream": True, "temperature": 0,
            "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}]}
    pieces = 0
    with httpx.stream("POST", server.address + "/chat/completions", json=long, timeout=120) as response:
        job_id = int(response.headers["X-Evoke-Job"])
        assert job_id > int(first.headers["X-Evoke-Job"])
        for line in response.iter_lines():
            if line.startswith("data: {") and '"content": "' in line:
                pieces += 1
                if pieces == 3:
                    running = [j for j in engine.jobs() if j.id == job_id]
                    assert running and running[0].command == "turn"
                    assert engine.cancel_job(job_id)
    assert 3 <= pieces < 400
    assert not engine.cancel_job(job_id)                 # done: nothing to cancel
