"""Issue 58 item 1 on the real embedded model through the `openai` client: a stop string of several tokens never
reaches a chat reply, streamed or not, and the stored reply and its KV cells end before it too (the next turn
attends to what the client was shown)."""

from __future__ import annotations

import pytest
from helpers.server_fixtures import client_for, running_server

COUNT = [{"role": "user", "content": "Count from 1 to 10, one number per line, like '1. 1'."}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("stops")) as (engine, server):
        yield engine, server, client_for(server)


def multi_token_stop(engine, text: str) -> str:
    """A stop string from the middle of `text` that spans at least three tokens and starts inside one."""
    assert len(engine.tokenize(text, special=False)) > 12, text
    middle = len(text) // 2
    stop = text[middle:middle + 6]
    assert len(engine.tokenize(stop, special=False)) >= 3, stop
    return stop


@pytest.fixture(scope="module")
def counting(served):
    engine, _, client = served
    free = client.chat.completions.create(model="evoke", messages=COUNT, max_tokens=48, temperature=0)
    text = free.choices[0].message.content
    stop = multi_token_stop(engine, text)
    return text, stop, text[:text.find(stop)]


def reply_blocks_text(engine, conversation_id: str) -> str:
    """The text of the KV cells of the conversation's last reply (its assistant blocks, template markup included)."""
    blocks = engine.blocks(conversation_id, with_text=True)
    last_turn = max(b["turn"] for b in blocks if b["role"] == "assistant")
    return "".join(b["text"] for b in blocks if b["role"] == "assistant" and b["turn"] == last_turn)


def test_a_multi_token_stop_never_reaches_a_chat_reply(served, counting):
    engine, _, client = served
    text, stop, expected = counting
    raw = client.chat.completions.with_raw_response.create(model="evoke", messages=COUNT, max_tokens=48,
                                                           temperature=0, stop=[stop])
    done = raw.parse()
    assert done.choices[0].message.content == expected and done.choices[0].finish_reason == "stop"
    conversation_id = raw.headers["X-Evoke-Conversation"]
    assert engine.messages(conversation_id)[-1]["text"] == expected
    cells = reply_blocks_text(engine, conversation_id)
    assert stop not in cells
    assert cells.endswith(expected + "\n")       # then the closing (`<|im_end|>\n`: special tokens have no text)
    engine.check(conversation_id)                                  # the table and llama.cpp's cells agree


def test_a_multi_token_stop_never_reaches_a_streamed_reply(served, counting):
    engine, _, client = served
    text, stop, expected = counting
    pieces = []
    for chunk in client.chat.completions.create(model="evoke", messages=COUNT, max_tokens=48, temperature=0,
                                                stop=[stop], stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    assert "".join(pieces) == expected


def test_the_issue_s_stop_strings(served, counting):
    """The issue's own cases, on whatever the model counts: the reply ends where the stop began."""
    _, _, client = served
    text = counting[0]
    for stop in ("\n3. 3", "2\n3", ". 2\n"):
        done = client.chat.completions.create(model="evoke", messages=COUNT, max_tokens=48, temperature=0,
                                              stop=[stop])
        assert done.choices[0].message.content == (text[:text.find(stop)] if stop in text else text)


def test_the_next_turn_continues_from_the_text_before_the_stop(served, counting):
    engine, _, client = served
    text, stop, expected = counting
    session = {"X-Evoke-Session": "stop-then-continue"}
    first = client.chat.completions.create(model="evoke", messages=COUNT, max_tokens=48, temperature=0,
                                           stop=[stop], extra_headers=session)
    assert first.choices[0].message.content == expected
    history = [*COUNT, {"role": "assistant", "content": expected}, {"role": "user", "content": "Go on."}]
    raw = client.chat.completions.with_raw_response.create(model="evoke", messages=history, max_tokens=8,
                                                           temperature=0, extra_headers=session)
    second = raw.parse()
    assert second.model_extra["evoke"]["route"] == "continue"      # the stored reply is what the client holds
    engine.check(raw.headers["X-Evoke-Conversation"])
