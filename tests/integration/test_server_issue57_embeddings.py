"""Issue 57 (items 2 and 7) and 58 (item 8), `/v1/embeddings` against the real model and embedder: a big request
runs in parts and stops when its client leaves, so the next chat is not queued behind the rest (asserted on the
engine's job order and the parts run, not on seconds); a lone surrogate is a 400 and an unknown model a 404; token-id
input is read in the embedder's own vocabulary."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
from helpers.server_fixtures import running_server

from evoke_engine.server.clients import new_token
from evoke_engine.server.embeddings import parts_of

TOKEN = new_token()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("issue57-embeddings")) as (engine, server):
        warm = embed(server, {"model": "evoke", "input": "warm up"})        # the embedder loaded before any test
        assert warm.status_code == 200, warm.text
        yield engine, server


def embed(server, body: dict | None = None, *, content: bytes | None = None, timeout: float = 120) -> httpx.Response:
    kw = {"content": content} if content is not None else {"json": body}
    return httpx.post(server.address + "/embeddings", headers={"X-Evoke-Client": TOKEN, "Content-Type":
                                                                "application/json"}, timeout=timeout, **kw)


def vectors(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.asarray([item["embedding"] for item in response.json()["data"]], dtype=np.float32)


# -- item 7: bad input is a 4xx, not a 500 ---------------------------------------------------------------------------

def test_a_lone_surrogate_is_a_400_not_a_500(served):
    _, server = served
    response = embed(server, content=b'{"model": "evoke", "input": ["fine", "a\\ud800b"]}')
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_unicode" and "TypeError" not in response.text


def test_an_unknown_model_is_refused_like_chat(served):
    _, server = served
    response = embed(server, {"model": "text-embedding-3-small", "input": "hello"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
    assert embed(server, {"model": "all-MiniLM-L6-v2", "input": "hello"}).status_code == 200


def test_a_request_past_the_size_limits_is_a_413(served):
    _, server = served
    response = embed(server, {"model": "evoke", "input": ["word " * 7000] * 40})      # 1.4 MB of text
    assert response.status_code == 413 and response.json()["error"]["code"] == "input_too_large"


# -- 58.8: token ids -----------------------------------------------------------------------------------------------

def embedder_ids(engine, text: str) -> list[int]:
    return engine.thread.call(lambda: engine.ensure_model().embedder._load().tokenizer.encode(text).ids)


def test_token_id_input_embeds_what_the_ids_spell_in_the_embedders_vocabulary(served):
    engine, server = served
    texts = ["a cat sat on the mat", "tax law in the netherlands"]
    by_text = vectors(embed(server, {"model": "evoke", "input": texts}))
    by_ids = vectors(embed(server, {"model": "evoke", "input": [embedder_ids(engine, t) for t in texts]}))
    one = vectors(embed(server, {"model": "evoke", "input": embedder_ids(engine, texts[0])}))
    assert by_ids.shape == by_text.shape and one.shape == (1, by_text.shape[1])
    assert np.min(np.sum(by_ids * by_text, axis=1)) > 0.999 and float(one[0] @ by_text[0]) > 0.999
    usage = embed(server, {"model": "evoke", "input": [[101, 2023, 102]]}).json()["usage"]
    assert usage["prompt_tokens"] == 3
    outside = embed(server, {"model": "evoke", "input": [101, 10 ** 9, 102]})
    assert outside.status_code == 400 and "vocabulary" in outside.json()["error"]["message"]


# -- item 2: a big request runs in parts; its client leaves and the rest never runs ------------------------------

def test_a_big_embeddings_request_whose_client_leaves_stops_and_the_next_chat_is_not_behind_it(served):
    engine, server = served
    log = server.app.state.embedding_log
    texts = [f"Paragraph {i}: " + "the tide rolls in over the harbour wall. " * 95 for i in range(256)]
    parts = len(parts_of(texts))
    ran_before, stopped_before = log.parts_run, log.requests_stopped
    with pytest.raises(httpx.ReadTimeout):
        embed(server, {"model": "evoke", "input": texts}, timeout=1.5)        # the client leaves mid-request
    chat = httpx.post(server.address + "/chat/completions", timeout=120, headers={"X-Evoke-Client": TOKEN},
                      json={"model": "evoke", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi."}]})
    assert chat.status_code == 200, chat.text
    chat_job = int(chat.headers["X-Evoke-Job"])
    deadline = time.monotonic() + 60                          # the request's task notices between two parts
    while log.requests_stopped == stopped_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert log.requests_stopped == stopped_before + 1
    run = log.parts_run - ran_before
    assert 0 < run < parts, (run, parts)                      # several jobs, and not all of them
    assert max(log.part_jobs[-run:]) < chat_job               # no part of it ran after the chat was queued
