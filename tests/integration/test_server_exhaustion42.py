"""Issue 42's exhaustion holes, through HTTP on loopback against the real model: a body trickled in meets a total
deadline and a minimum rate, one client cannot hold every place, connections past the cap get an OpenAI-shaped 503
with Retry-After, idle connections never lock others out, an imported history is sized as a whole and its rebuild
stops when its client leaves, and 5,000 combining characters are refused at once."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import httpx
import pytest
from helpers.server_fixtures import running_server

from evoke_engine.server.clients import new_token

CAP = 12                    # connections (and requests) the server keeps at once
PER_CLIENT = 3              # requests one client may have open
MAX_PREFILL = 3840          # tokens one request may have decoded (serve --max-prefill-tokens; default: the context)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("exhaustion"), header_timeout_s=5.0, body_timeout_s=3.0,
                        body_deadline_s=5.0, body_grace_s=2.0, min_body_bytes_per_s=64, max_connections=CAP,
                        max_requests_per_client=PER_CLIENT, max_prefill_tokens=MAX_PREFILL) as (engine, server):
        yield engine, server


def post(server, body: dict, *, token: str | None = None, timeout: float = 120) -> httpx.Response:
    return httpx.post(server.address + "/chat/completions", json=body, timeout=timeout,
                      headers={"X-Evoke-Client": token or new_token()})


def ask(text: str, max_tokens: int = 2) -> dict:
    return {"model": "evoke", "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": text}]}


def still_serving(server, within_s: float = 30.0) -> float:
    started = time.monotonic()
    response = post(server, ask("Say hi."), timeout=within_s)
    assert response.status_code == 200, response.text
    return time.monotonic() - started


def open_body(server, token: str, length: int = 100_000) -> socket.socket:
    """A connection whose request headers are in and whose body has begun (it holds a place)."""
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"X-Evoke-Client: {token}\r\nContent-Length: {length}\r\n\r\n{{\"messages\": ".encode())
    return sock


def answer_within(sock: socket.socket, seconds: float, trickle: bytes = b"", every_s: float = 0.5) -> bytes:
    """What the server answers within `seconds`, sending `trickle` every `every_s` meanwhile (b"" if nothing)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if trickle:
            with contextlib.suppress(OSError):
                sock.sendall(trickle)
        sock.settimeout(every_s)
        try:
            data = sock.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            return b""
        sock.settimeout(2.0)
        with contextlib.suppress(OSError):          # the rest of the response, up to the server's close
            while chunk := sock.recv(4096):
                data += chunk
        return data
    return b""


# -- a body has a total deadline and a minimum rate (not a per-read timeout) ------------------------------

def test_a_body_trickled_a_byte_at_a_time_is_408_once_under_the_rate(served):
    _, server = served
    started = time.monotonic()
    with open_body(server, new_token(), length=500) as sock:
        answer = answer_within(sock, 8.0, trickle=b" ", every_s=0.5)      # never silent for body_timeout_s
    assert b" 408 " in answer.split(b"\r\n", 1)[0], answer[:200]
    assert b"bytes/s" in answer and time.monotonic() - started < 4.5


def test_a_body_at_a_steady_rate_still_meets_the_whole_deadline(served):
    _, server = served
    started = time.monotonic()
    with open_body(server, new_token(), length=200_000) as sock:
        answer = answer_within(sock, 9.0, trickle=b" " * 100, every_s=0.25)     # 400 bytes/s: over the rate
    assert b" 408 " in answer.split(b"\r\n", 1)[0], answer[:200]
    assert b"took over 5 s" in answer and time.monotonic() - started < 7.0


# -- places: per client, in all, and idle connections ------------------------------------------------------

def test_one_client_cannot_hold_more_than_its_share(served):
    _, server = served
    token = new_token()
    held = [open_body(server, token) for _ in range(PER_CLIENT)]
    try:
        time.sleep(0.3)
        refused = post(server, ask("hi"), token=token, timeout=10)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["type"] == "rate_limit_error" and refused.headers["Retry-After"].isdigit()
        assert still_serving(server) < 30                       # another client is served meanwhile
    finally:
        for sock in held:
            sock.close()


def test_past_the_cap_the_refusal_is_an_openai_shaped_503_with_retry_after(served):
    _, server = served
    held = [open_body(server, new_token()) for _ in range(CAP)]        # busy, each a client of its own
    try:
        time.sleep(0.3)
        with httpx.Client() as http:
            response = http.post(server.address + "/chat/completions", json=ask("hi"), timeout=10)
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "server_busy" and response.headers["Retry-After"].isdigit()
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.3)
    still_serving(server)


def test_idle_connections_do_not_lock_others_out(served):
    _, server = served
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(CAP)]
    try:
        time.sleep(0.3)
        assert still_serving(server) < 30                      # the longest idle one made room
    finally:
        for sock in idle:
            sock.close()


# -- an imported history: sized as a whole, and cancelled when its client leaves ---------------------------

def exchanges(n: int, words: int = 0) -> list[dict]:
    messages = []
    for i in range(n):
        messages += [{"role": "user", "content": f"Question {i}: what is {i} plus {i}? " + "word " * words},
                     {"role": "assistant", "content": f"It is {2 * i}."}]
    return messages


def test_an_imported_history_is_sized_as_a_whole(served):
    engine, server = served
    history = exchanges(12, words=350) + [{"role": "user", "content": "And now?"}]    # each message fits alone
    started = time.monotonic()
    response = post(server, {"model": "evoke", "max_tokens": 2, "messages": history}, timeout=15)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and "rebuilt whole" in error["message"]
    assert time.monotonic() - started < 5
    assert not [c for c in engine.conversations() if c.title == "And now?"]


def test_a_client_that_leaves_stops_its_import_and_others_are_served(served):
    engine, server = served
    history = exchanges(20) + [{"role": "user", "content": "Import me."}]   # a rebuild of many seconds
    with pytest.raises(httpx.ReadTimeout):
        post(server, {"model": "evoke", "max_tokens": 2, "messages": history}, timeout=1.5)
    assert still_serving(server) < 6                          # not behind the whole rebuild
    time.sleep(0.5)
    assert not [c for c in engine.conversations() if c.title == "Import me."]     # nothing left behind


# -- 5,000 combining characters ---------------------------------------------------------------------------

def test_five_thousand_combining_characters_are_refused_at_once(served):
    _, server = served
    started = time.monotonic()
    response = post(server, ask("a" + "\u0301" * 5000), timeout=15)          # 10,000 tokens: one a byte
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert time.monotonic() - started < 3
    still_serving(server)


# -- kill -9 during eviction under a tiny budget: the restart continues without rebuilding everything --------

def kv_files(home) -> list:
    return [p for p in home.rglob("*") if p.is_file() and "kv" in p.parts and not p.name.endswith(".tmp")]


def test_a_kill_during_eviction_under_a_tiny_budget_continues_from_the_kv_file(tmp_path):
    from helpers.hostile_suite import Served, chat_body, send

    session = {"X-Evoke-Session": "evict"}
    notes = "Notes on lighthouses, tides, ropes and the keeper's log. "
    server = Served(tmp_path, budget=300, lifetime_s=300).wait()
    try:
        for text in ("Remember the code word falcon.", "Round 1 notes: " + notes * 20 + "Summarise them."):
            status, response = send(server, chat_body(text, 8), headers=session, timeout=120)
            assert status == 200, response.text if response is not None else status
        assert response.json()["evoke"]["evictions"] > 0                       # the budget is spent
        deadline = time.monotonic() + 20
        while not kv_files(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.25)
        files = kv_files(tmp_path)
        assert files, "no KV file written after the endpoint's turns: a kill -9 forces a whole rebuild"
        thread_body = chat_body("Round 2 notes: " + notes * 30 + "Summarise them at length.", 120, stream=True)
        killer = threading.Timer(1.5, server.kill9)                         # mid-turn: prefill and eviction
        killer.start()
        send(server, thread_body, headers=session, timeout=60)
        killer.join()
    finally:
        if server.proc.poll() is None:
            server.kill9()
    server = Served(tmp_path, budget=300, lifetime_s=300).wait()
    try:
        status, response = send(server, chat_body("Which code word did I give you?", 8), headers=session, timeout=90)
        assert status == 200, response.text if response is not None else status
        assert response.json()["evoke"]["route"] == "continue"
    finally:
        server.stop()
