"""Issue 57 through HTTP on loopback against the real model, from the attacker's side: junk client tokens trickling
bodies lock no known client out (item 1), a token-less request continues no other token-less request's conversation
by replay (item 4), one client's many sessions never push out another's (item 5), and a full disk is a 507 that names
no path (item 7). Limits are lowered through the server's config so each test takes seconds."""

from __future__ import annotations

import contextlib
import socket

import httpx
import pytest
from helpers.server_fixtures import running_server

from evoke_engine.server.admission import reserved_for_known
from evoke_engine.server.clients import new_token

CAP = 12                    # requests the server takes at once
PER_CLIENT = 3              # requests one client may have open
PER_OWNER_SESSIONS = 3      # named sessions one client keeps
ALL_SESSIONS = 8            # named sessions kept in all


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("issue57"), header_timeout_s=10.0, body_timeout_s=8.0,
                        body_deadline_s=20.0, body_grace_s=10.0, min_body_bytes_per_s=16, max_connections=CAP,
                        max_requests_per_client=PER_CLIENT, max_sessions_per_client=PER_OWNER_SESSIONS,
                        max_sessions=ALL_SESSIONS) as (engine, server):
        yield engine, server


def ask(text: str, max_tokens: int = 2, history: list[dict] | None = None) -> dict:
    return {"model": "evoke", "max_tokens": max_tokens, "temperature": 0,
            "messages": [*(history or []), {"role": "user", "content": text}]}


def post(server, body: dict, headers: dict | None = None, timeout: float = 120) -> httpx.Response:
    return httpx.post(server.address + "/chat/completions", json=body, headers=headers or {}, timeout=timeout)


def trickle(server, token: str | None) -> socket.socket:
    """A connection whose headers are in and whose body has begun (it would hold a place while it trickles)."""
    sock = socket.create_connection(("127.0.0.1", server.port))
    client = f"X-Evoke-Client: {token}\r\n" if token is not None else ""
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"{client}Content-Length: 100000\r\n\r\n{{\"messages\": ".encode())
    return sock


HELD = b"held"              # no answer yet: the server still reads the body (the request holds its place)


def answered(sock: socket.socket, wait_s: float = 1.0) -> bytes:
    """The status line the server sent on `sock`, b"closed" when it closed it unanswered, or HELD."""
    sock.settimeout(wait_s)
    try:
        return sock.recv(4096).split(b"\r\n", 1)[0] or b"closed"
    except TimeoutError:
        return HELD
    except OSError:
        return b"closed"


def refused(line: bytes) -> bool:
    """Answered 503 (no place for it), or closed past the connection cap: either way it holds nothing."""
    return b" 503 " in line or line == b"closed"


# -- item 1: junk tokens, new tokens and token-less trickles; a known client is served ----------------------------

def test_junk_token_trickles_lock_no_known_client_out(served):
    _, server = served
    known = new_token()
    first = post(server, ask("Say hi."), headers={"X-Evoke-Client": known, "X-Evoke-Session": "known"})
    assert first.status_code == 200, first.text                  # the server knows this client from now on
    junk, junk_lines = [], []
    for i in range(2 * CAP):                      # each answered before the next opens, as a reconnecting attacker
        junk.append(trickle(server, f"junk{i}"))
        junk_lines.append(answered(junk[-1]))
    newcomers = [trickle(server, new_token()) for _ in range(CAP)]
    anonymous = [trickle(server, None) for _ in range(PER_CLIENT)]
    try:
        assert all(b" 400 " in line for line in junk_lines), junk_lines      # refused on the head, no place held
        untrusted = CAP - reserved_for_known(CAP)
        new_lines = [answered(sock, 0.3) for sock in newcomers]
        assert new_lines.count(HELD) == untrusted, new_lines                   # their bodies still trickle
        assert all(refused(line) for line in new_lines if line != HELD), new_lines
        assert all(refused(answered(sock)) for sock in anonymous)             # the untrusted places are all taken
        for turn in range(3):
            served_again = post(server, ask(f"Still there? {turn}"), headers={"X-Evoke-Client": known}, timeout=60)
            assert served_again.status_code == 200, served_again.text
        assert [answered(sock, 0.1) for sock in newcomers].count(HELD) == untrusted   # the attack was still on
    finally:
        for sock in junk + newcomers + anonymous:
            with contextlib.suppress(OSError):
                sock.close()


def test_a_malformed_client_token_is_a_400_before_its_body(served):
    _, server = served
    with trickle(server, "junk0") as sock:                        # the body never comes: the head alone is refused
        line = answered(sock, 5.0)
    assert b" 400 " in line, line


# -- item 4: a token-less request is its own throwaway owner ------------------------------------------------------

DOC = "\n".join(f"Note {i}: the pump in bay {i} runs at {100 + i} litres a minute." for i in range(12))


def test_a_token_less_request_never_continues_another_by_replay(served):
    engine, server = served
    opening = ask(f"Read these notes.\n\n{DOC}\n\nWhich bay runs at 105?", 6)
    first = post(server, opening)
    assert first.status_code == 200, first.text
    made, issued = first.headers["X-Evoke-Conversation"], first.headers["X-Evoke-Client"]
    reply = first.json()["choices"][0]["message"]["content"]
    replay = ask("And bay 7?", 4, history=[*opening["messages"], {"role": "assistant", "content": reply}])
    stranger = post(server, replay)                               # another token-less client, same history
    assert stranger.status_code == 200, stranger.text
    assert stranger.headers["X-Evoke-Conversation"] != made and stranger.json()["evoke"]["route"] != "continue"
    assert len(engine.open_conversation(made).messages()) == 2    # nothing was added to the first one
    owner = post(server, replay, headers={"X-Evoke-Client": issued})   # the token it was handed continues it
    assert owner.status_code == 200, owner.text
    assert owner.headers["X-Evoke-Conversation"] == made and owner.json()["evoke"]["route"] == "continue"


# -- item 5: sessions per owner --------------------------------------------------------------------------------------

def test_one_clients_sessions_never_push_out_anothers(served):
    engine, server = served
    alice, mallory = new_token(), new_token()
    mine = post(server, ask("Remember the word heron."), headers={"X-Evoke-Client": alice, "X-Evoke-Session": "mine"})
    assert mine.status_code == 200, mine.text
    conversation = mine.headers["X-Evoke-Conversation"]
    for i in range(3 * PER_OWNER_SESSIONS):
        made = post(server, ask(f"Session {i}."), headers={"X-Evoke-Client": mallory, "X-Evoke-Session": f"m{i}"})
        assert made.status_code == 200, made.text
    sessions = server.app.state.service.sessions
    assert sessions.sessions_of(engine_owner(mallory)) == PER_OWNER_SESSIONS
    again = post(server, ask("Which word?"), headers={"X-Evoke-Client": alice, "X-Evoke-Session": "mine"})
    assert again.headers["X-Evoke-Conversation"] == conversation          # alice's session is still hers
    for _ in range(ALL_SESSIONS):                                         # fill the map with clients of one name
        post(server, ask("Fill."), headers={"X-Evoke-Client": new_token(), "X-Evoke-Session": "one"})
    refused = post(server, ask("One more."), headers={"X-Evoke-Client": new_token(), "X-Evoke-Session": "new"})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "too_many_sessions"
    still = post(server, ask("Still mine?"), headers={"X-Evoke-Client": alice, "X-Evoke-Session": "mine"})
    assert still.status_code == 200 and still.headers["X-Evoke-Conversation"] == conversation


def engine_owner(token: str) -> str:
    from evoke_engine.server.clients import owner_of_token
    return owner_of_token(token)


# -- item 7: a full disk is a 507 naming no path ----------------------------------------------------------------------

def test_a_full_database_is_a_507_naming_no_path(served):
    engine, server = served
    database = engine.history._db
    with database.reading() as conn:
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        conn.execute(f"PRAGMA max_page_count = {pages}")
    try:
        response = post(server, ask("A long message to store. " + "words that need new pages " * 400, 2),
                        headers={"X-Evoke-Client": new_token()})
    finally:
        with database.reading() as conn:
            conn.execute("PRAGMA max_page_count = 1073741823")
    assert response.status_code == 507, response.text
    body = response.json()["error"]
    assert body["code"] == "insufficient_storage" and body["type"] == "server_error"
    assert str(database.path.parent) not in response.text and "sqlite" not in response.text.lower()
    assert post(server, ask("Room again?"), headers={"X-Evoke-Client": new_token()}).status_code == 200
