"""Issue 57 and 58.8, the endpoint's logic on plain objects: which share a request's head takes (items 1 and 4), the
per-owner session cap (item 5), how an embeddings request is sized and split (items 2 and 7, 58.8), and a storage
failure as the endpoint reports it (item 7: 507 or 503, no path)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from evoke_engine.server.admission import AdmissionMiddleware, MalformedToken, reserved_for_known, share_of
from evoke_engine.server.api_errors import ApiError
from evoke_engine.server.app import storage_refusal
from evoke_engine.server.clients import new_token, owner_of_token
from evoke_engine.server.embeddings import (
    MAX_INPUT_CHARS,
    PART_TEXTS,
    check_model,
    parts_of,
    read_inputs,
)
from evoke_engine.server.sessions import SessionMap
from evoke_engine.server.toolcalls import RawTextMap
from evoke_engine.store.sqlite_db import translate_sqlite_error

pytestmark = pytest.mark.unit


def scope(token: str | None = None, address: str = "127.0.0.1", authorization: str | None = None) -> dict:
    headers = [(b"host", b"127.0.0.1")]
    if token is not None:
        headers.append((b"x-evoke-client", token.encode()))
    if authorization is not None:
        headers.append((b"authorization", authorization.encode()))
    return {"type": "http", "headers": headers, "client": (address, 5000), "method": "POST", "path": "/v1/x"}


# -- item 1: a share is what the head proves ---------------------------------------------------------------------

def test_a_malformed_token_is_refused_never_a_share():
    for junk in ("junk0", "junk63", "a b c d e f g h i j k l m n", "x" * 200):
        with pytest.raises(MalformedToken):
            share_of(scope(junk), known=lambda _owner: True)


def test_a_known_token_is_trusted_a_new_one_is_not_and_token_less_clients_share_their_address():
    known_token, new = new_token(), new_token()
    known = {owner_of_token(known_token)}.__contains__
    assert share_of(scope(known_token), known).trusted
    fresh = share_of(scope(new), known)
    assert not fresh.trusted and fresh.key != share_of(scope(new_token()), known).key
    assert share_of(scope(), known) == share_of(scope(), known) and not share_of(scope(), known).trusted
    assert share_of(scope(address="10.0.0.2"), known).key != share_of(scope(), known).key


def test_with_an_api_key_the_key_is_one_trusted_share():
    key = "sk-local-test"
    assert share_of(scope(authorization=f"Bearer {key}"), lambda _o: False, key).trusted
    assert share_of(scope(new_token(), authorization=f"Bearer {key}"), lambda _o: False, key).trusted
    assert not share_of(scope(authorization="Bearer wrong"), lambda _o: False, key).trusted


class Held:
    """An ASGI app whose requests stay in flight until released (a body still trickling in)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def __call__(self, scope, receive, send) -> None:
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def _status(middleware, request_scope) -> int | None:
    sent: list[dict] = []

    async def send(message):
        sent.append(message)
    task = asyncio.create_task(middleware(request_scope, None, send))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    if task.done():
        return sent[0]["status"]
    return None                         # holding a place


def test_untrusted_shares_never_take_the_places_kept_for_known_clients():
    async def scenario():
        app = Held()
        known_token = new_token()
        middleware = AdmissionMiddleware(app, max_requests=12, per_client=3,
                                         known={owner_of_token(known_token)}.__contains__)
        junk = [await _status(middleware, scope(f"junk{i}")) for i in range(24)]
        newcomers = [await _status(middleware, scope(new_token())) for _ in range(12)]
        anonymous = await _status(middleware, scope())
        valid = await _status(middleware, scope(known_token))
        app.release.set()
        return junk, newcomers, anonymous, valid
    junk, newcomers, anonymous, valid = asyncio.run(scenario())
    assert junk == [400] * 24                                 # refused on the head, none holds a place
    untrusted = 12 - reserved_for_known(12)
    assert newcomers == [None] * untrusted + [503] * (12 - untrusted)
    assert anonymous == 503 and valid is None                 # the known client is served (holds a place)


# -- item 5: sessions per owner ----------------------------------------------------------------------------------

def session_map(tmp_path: Path, per_owner: int, in_all: int) -> tuple[SessionMap, list[list[str]]]:
    ticks = iter(range(10_000))
    sessions = SessionMap(tmp_path / "api_sessions.json", RawTextMap(), clock=lambda: float(next(ticks)))
    sessions.max_per_owner, sessions.max_sessions = per_owner, in_all
    forgotten: list[list[str]] = []
    sessions.on_forget = forgotten.append
    return sessions, forgotten


def test_an_owner_past_its_cap_forgets_its_own_oldest_names_only(tmp_path):
    sessions, forgotten = session_map(tmp_path, per_owner=3, in_all=100)
    sessions.set("alice", "a1", "conv-a1")
    for i in range(5):
        sessions.set("mallory", f"m{i}", f"conv-m{i}")
    assert sessions.get("alice", "a1") == "conv-a1"
    assert sessions.sessions_of("mallory") == 3
    assert [sessions.get("mallory", f"m{i}") for i in range(5)] == [None, None, "conv-m2", "conv-m3", "conv-m4"]
    assert forgotten == [["conv-m0"], ["conv-m1"]]


def test_past_the_total_a_new_owner_is_refused_and_nobody_else_loses_a_name(tmp_path):
    sessions, _ = session_map(tmp_path, per_owner=3, in_all=4)
    sessions.set("alice", "a1", "conv-a1")
    for i in range(3):
        sessions.set("mallory", f"m{i}", f"conv-m{i}")
    assert not sessions.room_for("carol", "c1")               # a new name, nothing of carol's to forget
    assert sessions.room_for("alice", "a1") and sessions.room_for("mallory", "m9")
    sessions.set("mallory", "m9", "conv-m9")                  # mallory's own oldest goes, alice's stays
    assert sessions.get("alice", "a1") == "conv-a1" and sessions.get("mallory", "m0") is None
    assert len(sessions) == 4


def test_owners_are_known_from_their_conversations_and_names(tmp_path):
    sessions, _ = session_map(tmp_path, per_owner=3, in_all=10)
    sessions.set("client:abc", None, "conv-1")
    sessions.set("client:def", "s", "conv-2")
    assert sessions.has_owner("client:abc") and sessions.has_owner("client:def")
    assert not sessions.has_owner("client:ghi")
    sessions.prune(lambda cid: cid != "conv-1")
    assert not sessions.has_owner("client:abc")


# -- items 2, 7 and 58.8: an embeddings request, sized and split --------------------------------------------------

def test_embedding_inputs_are_texts_or_token_ids():
    assert read_inputs("one").texts == ["one"]
    assert read_inputs(["a", "b"]).texts == ["a", "b"]
    assert read_inputs([101, 2023, 102]).ids == [[101, 2023, 102]]
    assert read_inputs([[1, 2], [3]]).ids == [[1, 2], [3]]


@pytest.mark.parametrize(("value", "status", "code"), [
    ("a\ud800b", 400, "invalid_unicode"),
    (["fine", "bad \udc00"], 400, "invalid_unicode"),
    (["x" * (MAX_INPUT_CHARS + 1)], 413, "input_too_large"),
    (["x" * 30_000] * 256, 413, "input_too_large"),            # the 7.8 MB request: refused before work
    (["a"] * 257, 413, "too_many_inputs"),
    ([[1, 2], []], 400, "invalid_input"),
    ([[7] * 8193], 413, "input_too_large"),
])
def test_embedding_inputs_past_a_limit_are_clear_refusals(value, status, code):
    with pytest.raises(ApiError) as refused:
        read_inputs(value)
    assert (refused.value.status, refused.value.code) == (status, code)


def test_an_embeddings_request_runs_in_bounded_parts_in_order():
    texts = [f"text {i} " + "w" * (i * 500) for i in range(40)]
    parts = parts_of(texts)
    assert [t for part in parts for t in part] == texts
    assert len(parts) > 1 and all(len(part) <= PART_TEXTS for part in parts)
    assert all(sum(min(len(t), 4096) for t in part) <= 8192 or len(part) == 1 for part in parts)


def test_embeddings_refuse_an_unknown_model_like_chat():
    for name in (None, "", "evoke", "SmolLM2", "SmolLM2.gguf", "all-MiniLM-L6-v2", "bundled:all-MiniLM-L6-v2"):
        check_model(name, "SmolLM2", "")
    with pytest.raises(ApiError) as refused:
        check_model("text-embedding-3-small", "SmolLM2", "")
    assert refused.value.status == 404 and refused.value.code == "model_not_found"


# -- item 7: a full disk is a 507 naming no path -------------------------------------------------------------------

def test_a_full_disk_is_a_507_that_names_no_path(tmp_path):
    path = tmp_path / "secret-folder" / "history.sqlite3"
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode = sqlite3.SQLITE_FULL
    store_error = translate_sqlite_error(full, path)
    assert str(path) in str(store_error)                      # the window's message names it; the endpoint must not
    try:
        try:
            raise store_error
        except Exception as exc:
            raise ApiError(500, f"the engine could not open the conversation: {exc}", "engine_error") from exc
    except ApiError as wrapped:
        refusal = storage_refusal(wrapped)
    assert refusal is not None and refusal.status == 507 and "secret-folder" not in refusal.message
    readonly = sqlite3.OperationalError("attempt to write a readonly database")
    readonly.sqlite_errorcode = sqlite3.SQLITE_READONLY
    other = storage_refusal(translate_sqlite_error(readonly, path))
    assert other.status == 503 and "secret-folder" not in other.message
    assert storage_refusal(ValueError("not storage")) is None
