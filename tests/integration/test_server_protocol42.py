"""Issue 42, items 7-10 on loopback against the real model: strict types and request framing, one Host check, the
data-folder lock that deleting its file does not defeat, a full disk during a streamed turn, and the length of an
attachment's file name. Before: `"stream": "true"` streamed; an obs-folded header and two identical Content-Length
headers were accepted; Content-Length with Transfer-Encoding waited for the body timeout (408); h11's refusals were
uvicorn's plain text; `user@127.0.0.1` passed the Host check; deleting `evoke-desk.lock` let a second `serve` start;
a streamed turn whose reply could not be saved took back the message its 200 had acknowledged; a 10,000-character
file name was prefilled."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from helpers.server_fixtures import running_server

from evoke_engine.server.clients import new_token
from evoke_engine.store.owner import LOCK_NAME
from evoke_engine.store.store_error import DISK_FULL, StoreError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    home = tmp_path_factory.mktemp("protocol42")
    with running_server(home, body_timeout_s=10.0) as (engine, server):
        yield engine, server, home


def body(text: str, **extra) -> dict:
    return {"model": "evoke", "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": text}], **extra}


def raw(server, data: bytes, wait_s: float = 8.0) -> tuple[int, dict, float]:
    """Send `data` on a fresh connection; the status, the JSON body and the seconds until the server closed."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=wait_s) as sock:
        sock.sendall(data)
        received = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            received += chunk
    head, _, rest = received.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0
    try:
        payload = json.loads(rest)
    except ValueError:
        payload = {"raw": rest.decode("latin-1")}
    return status, payload, time.monotonic() - started


def request(path: str, headers: list[str], content: bytes = b"", method: str = "POST") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n").encode() + content


def shaped(payload: dict) -> bool:
    error = payload.get("error")
    return isinstance(error, dict) and {"message", "type", "code"} <= set(error)


# -- item 7: types, framing, Host ------------------------------------------------------------------------------

def test_a_string_where_a_boolean_goes_is_a_400(served):
    _, server, _ = served
    response = httpx.post(server.address + "/chat/completions", json=body("Hi.", stream="true"), timeout=60,
                          headers={"X-Evoke-Client": new_token()})
    assert response.status_code == 400 and shaped(response.json())
    assert "stream" in response.json()["error"]["message"]


@pytest.mark.parametrize(("name", "headers"), [
    ("obs-fold", ["Host: 127.0.0.1", "Content-Type: application/json", "X-Note: one", " folded", "Content-Length: 2"]),
    ("two identical Content-Length", ["Host: 127.0.0.1", "Content-Length: 2", "Content-Length: 2"]),
    ("a Content-Length list", ["Host: 127.0.0.1", "Content-Length: 2, 2"]),
    ("Content-Length and chunked", ["Host: 127.0.0.1", "Content-Length: 2", "Transfer-Encoding: chunked"]),
])
def test_an_ambiguous_request_head_is_an_immediate_shaped_400(served, name, headers):
    _, server, _ = served
    status, payload, seconds = raw(server, request("/v1/chat/completions", headers, b"{}"))
    assert status == 400 and shaped(payload), (name, payload)
    assert payload["error"]["code"] == "invalid_framing" and seconds < 3, (name, seconds)


def test_the_second_request_on_a_kept_alive_connection_is_checked_too(served):
    _, server, _ = served
    first = request("/health", ["Host: 127.0.0.1"], method="GET")
    second = request("/v1/chat/completions", ["Host: 127.0.0.1", "Content-Length: 2", "Content-Length: 2"], b"{}")
    with socket.create_connection(("127.0.0.1", server.port), timeout=8) as sock:
        sock.sendall(first)
        answer = sock.recv(65536)
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536)
        head, body = answer.split(b"\r\n\r\n", 1)
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        while len(body) < length:                # the whole first response: its body may come in a later segment
            body += sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 ")
        sock.sendall(second)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 ") and b"invalid_framing" in answer


def test_what_h11_cannot_parse_is_a_shaped_400_too(served):
    _, server, _ = served
    for data in (b"NOT HTTP AT ALL\r\n\r\n", request("/v1/models", [], method="GET")):   # the 2nd: no Host
        status, payload, _ = raw(server, data)
        assert status == 400 and shaped(payload), payload


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:{port}", "localhost", "localhost:{port}", "LocalHost.",
                                  "[::1]", "[::1]:{port}", "127.0.0.2:{port}"])
def test_every_loopback_host_form_passes(served, host):
    _, server, _ = served
    status, payload, _ = raw(server, request("/v1/models", [f"Host: {host.format(port=server.port)}",
                                                            "Connection: close"], method="GET"))
    assert status == 200, payload


@pytest.mark.parametrize(("host", "status"), [("user@127.0.0.1", 400), ("user@127.0.0.1:{port}", 400),
                                              ("127.0.0.1/v1", 400), ("evil.example", 403),
                                              ("127.0.0.1.evil.example:{port}", 403), ("10.0.0.5", 403)])
def test_any_other_host_is_a_shaped_refusal(served, host, status):
    _, server, _ = served
    got, payload, _ = raw(server, request("/v1/models", [f"Host: {host.format(port=server.port)}",
                                                         "Connection: close"], method="GET"))
    assert got == status and shaped(payload), payload


# -- item 10: an attachment's file name ------------------------------------------------------------------------

def test_a_file_name_past_255_characters_is_a_400_before_any_prefill(served):
    _, server, _ = served
    part = {"type": "file", "file": {"filename": "n" * 300 + ".txt", "file_data": "short"}}
    request_body = {"model": "evoke", "max_tokens": 1, "messages": [{"role": "user", "content": [part]}]}
    response = httpx.post(server.address + "/chat/completions", json=request_body, timeout=120,
                          headers={"X-Evoke-Client": new_token()})
    assert response.status_code == 400 and shaped(response.json()), response.text


# -- item 9: a full disk during a streamed turn ----------------------------------------------------------------

def full_disk(monkeypatch, engine, roles: set[str]) -> None:
    """SQLite's writes of rows with these roles fail as on a full disk (what `HistoryDB` raises for ENOSPC)."""
    add, update = engine.history.add_message, engine.history.update_message

    def add_message(conversation_id, role, *args, **kwargs):
        if role in roles:
            raise StoreError("database or disk is full", reason=DISK_FULL)
        return add(conversation_id, role, *args, **kwargs)

    def update_message(*args, **kwargs):
        if "assistant" in roles:
            raise StoreError("database or disk is full", reason=DISK_FULL)
        return update(*args, **kwargs)
    monkeypatch.setattr(engine.history, "add_message", add_message)
    monkeypatch.setattr(engine.history, "update_message", update_message)


def stream(server, text: str, session: str, token: str) -> tuple[int, str, str]:
    with httpx.stream("POST", server.address + "/chat/completions", json=body(text, stream=True, max_tokens=8),
                      headers={"X-Evoke-Client": token, "X-Evoke-Session": session}, timeout=120) as response:
        return response.status_code, response.headers.get("X-Evoke-Conversation", ""), response.read().decode()


def test_a_streamed_turn_whose_reply_cannot_be_saved_keeps_the_message_its_200_acknowledged(served, monkeypatch):
    engine, server, _ = served
    token = new_token()
    full_disk(monkeypatch, engine, {"assistant"})
    status, conversation_id, events = stream(server, "Remember the word heliotrope.", "full-disk", token)
    assert status == 200 and '"error"' in events and events.rstrip().endswith("data: [DONE]")
    texts = [m.text for m in engine.history.messages(conversation_id)]
    assert texts == ["Remember the word heliotrope."]              # kept: the 200 acknowledged it
    monkeypatch.undo()                                              # room again: the conversation goes on
    status, again, events = stream(server, "And now?", "full-disk", token)
    assert status == 200 and again == conversation_id and '"error"' not in events
    roles = [m.role for m in engine.history.messages(conversation_id)]
    assert roles == ["user", "user", "assistant"]


def test_a_streamed_request_whose_message_cannot_be_stored_is_refused_before_the_200(served, monkeypatch):
    engine, server, _ = served
    full_disk(monkeypatch, engine, {"user", "assistant"})
    status, _, events = stream(server, "This cannot be written.", "full-disk-2", new_token())
    assert status == 507 and shaped(json.loads(events)), events          # issue 57 item 7: 507, no path
    message = json.loads(events)["error"]["message"]
    assert "disk is full" in message and "history.sqlite3" not in message


# -- item 8: the data-folder lock ------------------------------------------------------------------------------

def test_deleting_the_lock_file_does_not_let_a_second_serve_start(served):
    engine, server, home = served
    lock_file = engine.settings.data_dir / LOCK_NAME
    lock_file.unlink()
    env = {**os.environ, "EVOKE_HOME": str(home), "PYTHONPATH": str(ROOT)}
    # --lifetime bounds a serve that wrongly started; timeout only guards against a hang
    done = subprocess.run([sys.executable, "-m", "evoke_engine", "serve", "--port", "0", "--lifetime", "15"],
                          capture_output=True, text=True, env=env, timeout=240, cwd=str(home))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"using the data folder {engine.settings.data_dir}" in done.stderr
    assert httpx.get(server.address + "/models", timeout=30).status_code == 200       # the owner serves on
