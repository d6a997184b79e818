"""Issue 41, item 6: stateless API requests (no X-Evoke-Session) on loopback against the real model. One that
times out or is dropped before its first token leaves no conversation (before: one timed-out SDK call with two
retries left three conversations with empty cancelled replies); the conversations they make are marked stateless,
expire with their KV file's TTL, and the window lists them apart, after its own."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from helpers.server_fixtures import client_for, running_server

DOC = "\n".join(f"Line {i}: the service at port {8000 + i} restarts nightly and logs to svc{i}.log."
                for i in range(90))                      # ~2.3K tokens: a prefill of seconds on this CPU


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("stateless")) as (engine, server):
        yield engine, server


def settle(server, timeout: float = 60.0) -> None:
    """Until no generation runs and no lock is held (a cancelled request's cleanup has finished)."""
    service = server.app.state.service
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not service._in_flight and not any(lock.locked() for lock in service._locks.values()):
            return
        time.sleep(0.1)
    raise AssertionError("requests still running")


def ids(engine) -> set[str]:
    return {c.id for c in engine.conversations()}


def test_a_timed_out_stateless_call_with_retries_leaves_no_conversation(served):
    engine, server = served
    before = ids(engine)
    client = client_for(server).with_options(timeout=1.0, max_retries=2)
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model="evoke", max_tokens=32, temperature=0,
                                       messages=[{"role": "user", "content": f"Read this.\n\n{DOC}\n\nSummarize."}])
    settle(server)
    assert ids(engine) == before


def test_a_stateless_stream_dropped_before_its_first_token_leaves_no_conversation(served):
    engine, server = served
    before = ids(engine)
    body = {"model": "evoke", "stream": True, "max_tokens": 32, "temperature": 0,
            "messages": [{"role": "user", "content": f"Read this.\n\n{DOC}\n\nWhich port does line 3 use?"}]}
    with httpx.stream("POST", f"{server.address}/chat/completions", json=body, timeout=60) as response:
        made = response.headers["X-Evoke-Conversation"]
        next(response.iter_lines())                      # the role chunk: the turn runs, no token yet
    settle(server)
    assert engine.history.get_conversation(made) is None and ids(engine) == before


def test_stateless_conversations_are_marked_expire_with_their_ttl_and_are_listed_apart(served, qtbot):
    from app.item_models import STATELESS_GROUP, ConversationListModel, GroupRole, IdRole

    engine, server = served
    client = client_for(server)
    ask = {"model": "evoke", "max_tokens": 4, "temperature": 0}
    one_shot = client.chat.completions.with_raw_response.create(
        messages=[{"role": "user", "content": "Say yes."}], **ask).headers["X-Evoke-Conversation"]
    kept = client.chat.completions.with_raw_response.create(
        messages=[{"role": "user", "content": "Say no."}], extra_headers={"X-Evoke-Session": "kept"},
        **ask).headers["X-Evoke-Conversation"]
    mine = engine.new_conversation(system_prompt="You are brief.", tools=[], title="the window's own").id
    infos = {c.id: c for c in engine.conversations()}
    assert infos[one_shot].stateless and infos[one_shot].source == "api"
    assert not infos[kept].stateless and not infos[mine].stateless

    model = ConversationListModel()
    model.set_conversations(engine.conversations())
    groups = [model.data(model.index(i), GroupRole) for i in range(model.rowCount())]
    assert groups == sorted(groups, key=bool)                       # the window's own first, then the group
    assert model.data(model.index(groups.index(STATELESS_GROUP)), IdRole) == one_shot

    service = server.app.state.service
    ttl = engine.settings.ttl_seconds()["long"]
    assert service.expire_stateless(now=time.time() + ttl / 2) == []          # not idle long enough
    assert service.expire_stateless(now=time.time() + ttl + 60) == [one_shot]
    assert engine.history.get_conversation(one_shot) is None
    assert engine.history.get_conversation(kept) is not None and engine.history.get_conversation(mine) is not None
