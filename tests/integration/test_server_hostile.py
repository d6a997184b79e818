"""The holes a hostile tester found in the endpoint, each through HTTP on loopback against the real model:
sessions bound to the client that made them, sizes refused before tokenizing, a non-streaming client that
leaves, lone surrogates, duplicate credentials, file parts without a file, slow and idle connections."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from helpers.server_fixtures import client_for, running_server

from evoke_engine.server.clients import new_token
from evoke_engine.server.sessions import SessionMap
from evoke_engine.server.toolcalls import RawTextMap

MAX_BYTES = 256 << 10


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("hostile"), max_request_bytes=MAX_BYTES, header_timeout_s=1.0,
                        body_timeout_s=1.0, max_connections=16) as (engine, server):
        yield engine, server


def post(server, body=None, *, headers=None, content=None, timeout=120):
    kw = {"content": content} if content is not None else {"json": body}
    return httpx.post(server.address + "/chat/completions", headers=headers or {}, timeout=timeout, **kw)


def ask(text: str, max_tokens: int = 8) -> dict:
    return {"model": "evoke", "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": text}]}


def still_serving(server) -> None:
    response = post(server, ask("Say hi.", 4), headers={"X-Evoke-Client": new_token()})
    assert response.status_code == 200, response.text


def texts(engine, conversation_id: str) -> list[str]:
    return [m["text"] for m in engine.open_conversation(conversation_id).messages()]


# -- 1. conversations do not leak between clients -------------------------------------------------------

def test_a_session_name_never_grants_another_clients_conversation(served):
    engine, server = served
    alice, mallory = client_for(server), client_for(server)
    secret = "My deploy password is tulip-4471."
    first = alice.chat.completions.create(model="evoke", messages=[{"role": "user", "content": secret}],
                                          max_tokens=4, temperature=0, extra_headers={"X-Evoke-Session": "alice"})
    alice_conv = first.model_extra["evoke"]["conversation_id"]
    stolen = mallory.chat.completions.create(model="evoke", max_tokens=4, temperature=0,
                                             messages=[{"role": "user", "content": "What did I tell you?"}],
                                             extra_headers={"X-Evoke-Session": "alice"})
    figures = stolen.model_extra["evoke"]
    assert figures["conversation_id"] != alice_conv and figures["route"] == "new"
    assert secret not in texts(engine, figures["conversation_id"])
    by_id = mallory.chat.completions.create(model="evoke", max_tokens=4, temperature=0,
                                            messages=[{"role": "user", "content": "Repeat what I said."}],
                                            extra_headers={"X-Evoke-Session": alice_conv})
    assert by_id.model_extra["evoke"]["conversation_id"] != alice_conv
    again = alice.chat.completions.create(model="evoke", max_tokens=4, temperature=0,
                                          messages=[{"role": "user", "content": "Thanks."}],
                                          extra_headers={"X-Evoke-Session": "alice"})
    assert again.model_extra["evoke"]["conversation_id"] == alice_conv      # the owner still continues
    assert texts(engine, alice_conv)[:1] == [secret] and len(texts(engine, alice_conv)) == 4


def test_a_client_without_a_token_gets_one_and_continues_with_it(served):
    _, server = served
    first = post(server, ask("Name a colour."), headers={"X-Evoke-Session": "mine"})
    assert first.status_code == 200, first.text
    token = first.headers["X-Evoke-Client"]
    conv = first.headers["X-Evoke-Conversation"]
    bare = post(server, ask("Another one."), headers={"X-Evoke-Session": "mine"})
    assert bare.headers["X-Evoke-Conversation"] != conv          # a name alone is another client's name
    kept = post(server, ask("Another one."), headers={"X-Evoke-Session": "mine", "X-Evoke-Client": token})
    assert kept.headers["X-Evoke-Conversation"] == conv
    assert "X-Evoke-Client" not in kept.headers                   # it already has one


def test_a_guessable_client_token_is_refused(served):
    _, server = served
    response = post(server, ask("hi"), headers={"X-Evoke-Client": "alice"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_client_token"


def test_the_user_field_does_not_continue_another_chat(served):
    engine, server = served
    first = post(server, {**ask("Remember the word pelican."), "user": "bob"})
    second = post(server, {**ask("Which word?"), "user": "bob"})
    assert first.headers["X-Evoke-Conversation"] != second.headers["X-Evoke-Conversation"]
    assert "Remember the word pelican." not in texts(engine, second.headers["X-Evoke-Conversation"])


def test_sessions_expire_with_their_conversation(tmp_path):
    path = tmp_path / "api_sessions.json"
    sessions = SessionMap(path, RawTextMap())
    sessions.set("client:a", "s1", "a" * 32)
    sessions.set("client:a", "s2", "b" * 32)
    assert sessions.get("client:b", "s1") is None                 # names live in their owner's namespace
    assert (path.stat().st_mode & 0o777) == 0o600
    reopened = SessionMap(path, RawTextMap())
    assert reopened.get("client:a", "s1") == "a" * 32 and reopened.owner_of("b" * 32) == "client:a"
    assert reopened.prune(lambda cid: cid == "a" * 32) == 2       # s2 and its owner entry
    assert SessionMap(path, RawTextMap()).get("client:a", "s2") is None


def test_old_session_files_lose_their_unowned_names(tmp_path):
    path = tmp_path / "api_sessions.json"
    path.write_text(json.dumps({"sessions": {"alice": "c" * 32}, "raw_text": {}}))
    assert SessionMap(path, RawTextMap()).get("", "alice") is None and len(SessionMap(path, RawTextMap())) == 0


# -- 5. oversized input is refused before it is tokenized ------------------------------------------------

def test_a_body_over_the_byte_limit_is_413_and_nothing_waits(served):
    _, server = served
    huge = json.dumps(ask("x" * (MAX_BYTES * 4))).encode()
    response = post(server, content=huge, headers={"Content-Type": "application/json"})
    assert response.status_code == 413 and "server_max_request_bytes" in response.json()["error"]["message"]
    still_serving(server)


def test_a_body_without_content_length_is_counted_as_it_arrives(served):
    _, server = served

    def chunks():
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(MAX_BYTES // 4096 + 2):
            yield b"y" * 4096
        yield b'"}]}'
    response = httpx.post(server.address + "/chat/completions", content=chunks(),
                          headers={"Content-Type": "application/json"}, timeout=60)
    assert response.status_code == 413


def test_a_system_prompt_too_large_for_the_context_is_400_up_front(served):
    engine, server = served
    room = engine.settings.n_ctx // engine.settings.slots
    system = "word " * (room + 200)
    response = post(server, {"model": "evoke", "max_tokens": 4, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": "hi"}]})
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "system prompt and tools" in message and "tokens over" in message
    still_serving(server)


def test_a_system_prompt_that_leaves_the_budget_no_room_is_400_not_500(served):
    engine, server = served
    system = "Rules: " + " ".join(f"rule {i} is to be brief." for i in range(120))      # fits a slot, not the budget
    response = post(server, {"model": "evoke", "max_tokens": 4, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": "hi"}]})
    assert response.status_code == 400, response.text
    assert "smallest budget that works" in response.json()["error"]["message"]
    still_serving(server)


def test_a_message_too_large_for_the_context_says_by_how_much(served):
    engine, server = served
    response = post(server, ask("word " * (engine.settings.n_ctx + 50)))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert " over the " in response.json()["error"]["message"]


# -- 6. a non-streaming client that leaves stops its generation ------------------------------------------

def test_a_non_streaming_client_that_disconnects_is_cancelled(served):
    engine, server = served
    text = "Write a very long story about a lighthouse keeper and the sea, chapter by chapter."
    with pytest.raises(httpx.ReadTimeout):
        post(server, ask(text, 600), headers={"X-Evoke-Client": new_token()}, timeout=2.0)
    still_serving(server)                      # queued behind the cancelled turn, so it has ended
    ids = [i.id for i in engine.conversations() if i.title == text[:60]]
    assert len(ids) == 1
    messages = engine.open_conversation(ids[0]).messages()
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert len(engine.tokenize(messages[1]["text"])) < 600
    assert messages[1]["extra"]["metrics"]["stopped"] == "cancelled"      # not an end of text


# -- 7. a lone surrogate is a 400 that says where --------------------------------------------------------

def test_a_lone_surrogate_is_400_with_its_position(served):
    _, server = served
    body = b'{"model": "evoke", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    response = post(server, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "messages.0.content" and "character 1" in error["message"]
    still_serving(server)


# -- 9. the smaller ones ---------------------------------------------------------------------------------

def test_two_authorization_headers_are_refused(served):
    _, server = served
    with httpx.Client() as http:
        request = http.build_request("POST", server.address + "/chat/completions", json=ask("hi"),
                                     headers=[("Authorization", "Bearer a"), ("Authorization", "Bearer b")])
        response = http.send(request)
    assert response.status_code == 400 and response.json()["error"]["code"] == "duplicate_header"


def test_a_file_part_without_a_file_says_what_is_missing(served):
    _, server = served
    response = post(server, {"messages": [{"role": "user", "content": [{"type": "file", "file": None}]}]})
    assert response.status_code == 400
    assert "needs a 'file' object" in response.json()["error"]["message"]


def _closed_by_server(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        return sock.recv(1024) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_connection_that_never_finishes_its_headers_is_closed(served):
    _, server = served
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")     # and nothing more
        assert _closed_by_server(sock, within_s=10)


def test_a_body_shorter_than_its_content_length_is_408(served):
    _, server = served
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 500\r\n\r\n{\"messages\": ")
        sock.settimeout(10)
        assert b" 408 " in sock.recv(4096).split(b"\r\n", 1)[0]


def test_connections_past_the_cap_are_refused_and_idle_ones_time_out(served):
    _, server = served
    socks = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]
    try:
        deadline = time.monotonic() + 10
        closed = [_closed_by_server(s, within_s=max(0.1, deadline - time.monotonic())) for s in socks]
        assert all(closed)                     # the extras at once, the rest at the header deadline
    finally:
        for s in socks:
            s.close()
    still_serving(server)


def test_oversized_headers_are_431(served):
    _, server = served
    response = httpx.get(server.address.removesuffix("/v1") + "/health", headers={"X-Junk": "j" * (40 << 10)})
    assert response.status_code == 431
