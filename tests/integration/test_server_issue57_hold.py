"""Issue 57 item 6 from the attacker's side (HTTP on loopback, the real model, no --max-prefill-tokens): the longest
message, or the most fake exchanges, one client may send never holds a second client's 2-token chat until it ends."""

from __future__ import annotations

import re
import threading
import time

import httpx
import pytest
from helpers.server_fixtures import running_server

from evoke_engine import Settings
from evoke_engine.server.clients import new_token
from evoke_engine.worker import Command

ATTACKER, VICTIM = new_token(), new_token()
N_CTX = 4096                 # 1,024 tokens a slot: the longest message is 768 tokens, its prefill seconds here
# Asserted as an order (the victim's chat, sent once the attacker's prefill runs, ends first), never in seconds.


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    home = tmp_path_factory.mktemp("issue57-hold")
    small = Settings(home=str(home), budget_tokens=512, temperature=0.0, n_ctx=N_CTX)
    with running_server(home, settings=small) as (engine, server):
        assert chat(server, VICTIM, [user("Say hi.")]).status_code == 200        # warm: the model and the prefix
        yield engine, server


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def chat(server, token: str, messages: list[dict], max_tokens: int = 2, timeout: float = 600) -> httpx.Response:
    return httpx.post(server.address + "/chat/completions", timeout=timeout, headers={"X-Evoke-Client": token},
                      json={"model": "evoke", "max_tokens": max_tokens, "temperature": 0, "messages": messages})


def longest_message(server) -> str:
    """Words to the most tokens one message may be here (the context /v1/models advertises, less the reply's room)."""
    context = httpx.get(server.address + "/models", timeout=30).json()["data"][0]["context_length"]
    words = " ".join(f"w{i % 97}" for i in range(context))       # about two tokens a word: over the limit
    refused = chat(server, ATTACKER, [user(words)])
    assert refused.status_code == 400, refused.text
    said = re.search(r"the new message is (\d+) tokens, \d+ over the (\d+)", refused.json()["error"]["message"])
    assert said is not None, refused.text
    tokens, limit = int(said[1]), int(said[2])
    return " ".join(f"w{i % 97}" for i in range(int(context * limit / tokens * 0.95)))


def exchanges(pairs: int) -> list[dict]:
    """`pairs` user/assistant exchanges this server never wrote (the import route rebuilds them as one prefill)."""
    history = []
    for i in range(pairs):
        history += [user(f"Note {i}: the pump in bay {i} runs at {100 + i} litres."),
                    {"role": "assistant", "content": f"Noted: bay {i}, {100 + i} litres."}]
    return history


def most_fake_exchanges(server) -> list[dict]:
    """As many fake exchanges as one request may have rebuilt here (the same limit as one message)."""
    probe = 300
    refused = chat(server, ATTACKER, [*exchanges(probe), user("And bay 7?")])
    assert refused.status_code == 400, refused.text
    said = re.search(r"the messages are about (\d+) tokens, \d+ over the (\d+)", refused.json()["error"]["message"])
    assert said is not None, refused.text
    return exchanges(int(probe * int(said[2]) / int(said[1]) * 0.9))


def race(engine, server, attack: list[dict], started) -> tuple[list[str], httpx.Response, httpx.Response]:
    """The attacker's request in a thread; once `started(engine)` says its prefill runs, the victim's chat. Returns
    who finished first, then the two responses."""
    order: list[str] = []
    results: dict[str, httpx.Response] = {}

    def attacker() -> None:
        results["attacker"] = chat(server, ATTACKER, attack, max_tokens=4)
        order.append("attacker")

    thread = threading.Thread(target=attacker, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not started(engine) and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert started(engine), "the attacker's prefill never showed as running"
    results["victim"] = chat(server, VICTIM, [user("Say hi.")])
    order.append("victim")
    thread.join(600)
    return order, results["attacker"], results["victim"]


def streaming_turn(engine) -> bool:
    return any(job.command is Command.TURN for job in engine.thread.streaming())


def rebuilding(engine, before: set[str]) -> bool:
    """The attacker's import is being rebuilt: a REBUILD stream runs about a conversation made after `before`."""
    return any(job.command is Command.REBUILD and job.conversation_id not in before
               for job in engine.thread.streaming())


def test_the_longest_message_never_holds_another_clients_chat_behind_its_prefill(served):
    engine, server = served
    order, attacker, victim = race(engine, server, [user(longest_message(server))], streaming_turn)
    assert attacker.status_code == 200 and victim.status_code == 200, (attacker.text, victim.text)
    assert attacker.json()["usage"]["prompt_tokens"] > 600
    assert order == ["victim", "attacker"]


def test_a_history_of_fake_exchanges_never_holds_another_clients_chat_behind_its_rebuild(served):
    engine, server = served
    history = most_fake_exchanges(server)
    before = {row.id for row in engine.history.list_conversations()}
    order, attacker, victim = race(engine, server, [*history, user("Which bay runs at 110 litres?")],
                                   lambda engine: rebuilding(engine, before))
    assert attacker.status_code == 200 and victim.status_code == 200, (attacker.text, victim.text)
    assert attacker.json()["usage"]["prompt_tokens"] > 600
    assert order == ["victim", "attacker"]
