"""Eight clients on four slots at once through the `openai` client: all answered, no deadlock, and each
reply comes from its own conversation (a unique passkey in each client's attached file)."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor, wait

import pytest
from helpers.server_fixtures import client_for, running_server

from evoke_engine import Settings

CLIENTS, ROUNDS = 8, 2
PASSKEYS = [str(4000 + 613 * i) for i in range(CLIENTS)]


def file_part(name: str, text: str) -> dict:
    data = base64.b64encode(text.encode()).decode()
    return {"type": "file", "file": {"filename": name, "file_data": f"data:text/plain;base64,{data}"}}


def one_client(server, i: int) -> list[str]:
    client = client_for(server)
    note = f"Notes of team {i}.\nThe passkey is {PASSKEYS[i]}. Remember the passkey {PASSKEYS[i]}.\n"
    history = [{"role": "system", "content": "You are a helpful assistant."},
               {"role": "user", "content": [{"type": "text", "text": "What is the passkey in the file? "
                                                                     "Answer with the number."},
                                            file_part(f"team{i}.txt", note)]}]
    replies = []
    for _ in range(ROUNDS):
        reply = client.chat.completions.create(model="evoke", messages=history, max_tokens=12, temperature=0,
                                               extra_headers={"X-Evoke-Session": f"team-{i}"})
        text = reply.choices[0].message.content or ""
        replies.append(text)
        history += [{"role": "assistant", "content": text},
                    {"role": "user", "content": "Repeat the passkey from the file."}]
    return replies


@pytest.mark.slow
def test_eight_clients_on_four_slots(tmp_path):
    settings = Settings(home=str(tmp_path), budget_tokens=512, slots=4, temperature=0.0)
    with running_server(tmp_path, settings=settings) as (engine, server), ThreadPoolExecutor(CLIENTS) as pool:
        futures = [pool.submit(one_client, server, i) for i in range(CLIENTS)]
        done, pending = wait(futures, timeout=900)
        assert not pending, "requests did not finish: deadlock or starvation"
        results = [f.result() for f in futures]
        api = [c for c in engine.conversations() if c.source == "api"]
    assert len(api) == CLIENTS
    for i, replies in enumerate(results):
        others = set(PASSKEYS) - {PASSKEYS[i]}
        assert len(replies) == ROUNDS
        assert not any(key in text for text in replies for key in others), (i, replies)
        assert any(PASSKEYS[i] in text for text in replies), (i, replies)
