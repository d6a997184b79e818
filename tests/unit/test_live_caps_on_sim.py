"""Issue 58 item 9 on a whole Engine over the simulated backend: one-shot requests never keep a live conversation each.
With the caps lowered, N one-shot requests leave at most the cap of live API conversations per client and in all
(the others saved to their KV files and released), and a released one still continues correctly, reopened from its
file, when its client re-sends its history or names its session."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from helpers.sim_backend import SimBackend, conversation_text, rendered, sim_engine, sim_settings

from evoke_engine.server import ServerConfig
from evoke_engine.server.app import create_app
from evoke_engine.server.clients import new_token

pytestmark = pytest.mark.unit

PER_CLIENT, IN_ALL = 2, 3


@pytest.fixture
def served(tmp_path):
    backend = SimBackend(tmp_path / "sim.gguf")
    config = ServerConfig(max_live_per_client=PER_CLIENT, max_live=IN_ALL)
    with sim_engine(backend, sim_settings(tmp_path, slots=2)) as (engine, events), \
            TestClient(create_app(engine, config), base_url="http://127.0.0.1:8765",
                       raise_server_exceptions=False) as client:
        yield engine, client, events


def chat(client, token: str, messages: list[dict], session: str | None = None) -> tuple[str, dict]:
    headers = {"X-Evoke-Client": token, **({"X-Evoke-Session": session} if session else {})}
    response = client.post("/v1/chat/completions", headers=headers,
                           json={"model": "evoke", "messages": messages, "max_tokens": 8})
    assert response.status_code == 200, response.text
    body = response.json()
    return body["choices"][0]["message"]["content"], body["evoke"]


def question(i: int) -> dict:
    words = " ".join(f"w{i}x{j}" for j in range(40))       # enough tokens for a replay to be routed (>= 64 shared)
    return {"role": "user", "content": f"Question {i}: {words}"}


def live_api(engine) -> list[str]:
    engine.wait_idle()                          # the releases are jobs queued after each turn
    return [c.id for c in engine.conversations() if c.source == "api" and c.memory in ("slot", "ram")]


def test_one_shot_requests_leave_at_most_the_cap_live_and_a_released_one_continues_from_its_file(served):
    engine, client, events = served
    alice, bob = new_token(), new_token()
    first_reply, first = chat(client, alice, [question(0)])
    for i in range(1, 10):
        chat(client, alice, [question(i)])
    live = live_api(engine)
    assert len(live) <= PER_CLIENT, f"{len(live)} live conversations after 10 one-shot requests of one client"
    assert first["conversation_id"] not in live
    assert engine.kvfiles.has(first["conversation_id"]), "a released one-shot conversation is in its KV file"
    for i in range(10, 16):
        chat(client, bob, [question(i)])
    assert len(live_api(engine)) <= IN_ALL

    released = sum(1 for e in events if e.kind == "released")
    assert released >= 16 - IN_ALL

    # alice re-sends the first exchange with a new message: it continues that conversation, reopened from its file
    reply, again = chat(client, alice, [question(0), {"role": "assistant", "content": first_reply},
                                        {"role": "user", "content": "And one more thing?"}])
    assert again["conversation_id"] == first["conversation_id"] and again["route"] == "continue"
    assert again["decoded"] < 20, "only the new message was decoded: the rest came back from the file"
    cid = first["conversation_id"]
    assert [m["text"] for m in engine.messages(cid)] == [question(0)["content"], first_reply,
                                                         "And one more thing?", reply]
    assert conversation_text(engine, cid) == rendered(engine, cid)
    assert len(live_api(engine)) <= IN_ALL


def test_a_released_session_continues_from_its_file(served):
    engine, client, _ = served
    carol = new_token()
    reply, first = chat(client, carol, [question(0)], session="work")
    for i in range(1, 6):
        chat(client, carol, [question(i)])                  # one-shot requests push the session out of RAM
    cid = first["conversation_id"]
    assert cid not in live_api(engine) and engine.kvfiles.has(cid)
    second, again = chat(client, carol, [{"role": "user", "content": "Go on."}], session="work")
    assert again["conversation_id"] == cid and again["route"] == "continue"
    assert [m["text"] for m in engine.messages(cid)] == [question(0)["content"], reply, "Go on.", second]
    assert conversation_text(engine, cid) == rendered(engine, cid)
