"""Crash safety of a turn: a reply that cannot be saved rolls back, a reply streams into SQLite (a kill -9
loses at most its last second), a KV file written before the last messages is used with only the rest
decoded, and a rebuild shows its progress and is counted in the reply's timing."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers.clock import FakeClock

from evoke_engine import Engine, EventKind, Settings
from evoke_engine.conversations.reply_row import ReplySaveError, StreamedReply
from evoke_engine.conversations.snapshot_fit import expected_history
from evoke_engine.errors import EvokeError
from evoke_engine.store.history import DELETED, HistoryDB

ROOT = Path(__file__).resolve().parents[2]
DOC = "\n".join(f"Entry {i}: the cache at node {i} holds {i * 3} pages." for i in range(40))


def _settings(home: Path) -> Settings:
    return Settings(home=str(home), budget_tokens=1024, n_ctx=4096, slots=2)


def _agrees(engine: Engine, conv) -> None:
    """The conversation's KV history is what SQLite holds, and its blocks mirror llama.cpp's cells."""
    rows = engine.history.messages(conv.id)
    assert [(m["role"], m["content"]) for m in conv.template_history()] == expected_history(rows)
    turns = {m["evoke_turn"] for m in conv.template_history()}
    assert {b["turn"] for b in conv.blocks() if not b.get("shared")} <= turns
    conv.check()


# -- the streamed reply's row (plain objects: a real SQLite file, a fake clock) ---------------------------------
def test_a_streamed_reply_is_written_at_most_once_a_second_and_finalized(tmp_path):
    with HistoryDB(tmp_path / "h.sqlite3") as history:
        history.create_conversation("c", "t", "")
        clock = FakeClock(0.0)
        handed: list[tuple[float, str]] = []
        row = StreamedReply(history, "c", clock=clock, forward=lambda piece: handed.append((clock.now, piece)))
        for i in range(50):                          # 5 s of pieces, one every 0.1 s
            row.on_token(f"w{i} ")
            row.flush()                              # written on the reply's writer thread
            (saved,) = history.messages("c")
            assert saved.interrupted and saved.role == "assistant"
            # every piece handed on at least a second ago is in the row already
            assert saved.text.startswith("".join(p for t, p in handed if t <= clock.now - 1.0))
            clock.now += 0.1
        assert row.writes <= 6                       # at 0, 1, 2, 3, 4 s (and a rounding spare)
        row.finish(row.text + "end")
        (saved,) = history.messages("c")
        assert not saved.interrupted and saved.text.endswith("w49 end") and saved.id == row.row_id


def test_a_slow_write_never_holds_up_the_stream_and_the_newest_text_is_written(tmp_path):
    with HistoryDB(tmp_path / "h.sqlite3") as history:
        history.create_conversation("c", "t", "")
        gate, entered, streamed_on = threading.Event(), threading.Event(), []
        real_add = history.add_message

        def slow_add(*args, **kwargs):            # a commit waiting on the disk
            entered.set()
            gate.wait(10)
            return real_add(*args, **kwargs)

        history.add_message = slow_add
        clock = FakeClock(0.0)
        row = StreamedReply(history, "c", clock=clock, forward=streamed_on.append)
        row.on_token("first ")                    # its row's write starts on the writer thread ...
        assert entered.wait(5)
        for i in range(5):                        # ... and the stream goes on while it waits
            clock.now += 1.0
            row.on_token(f"w{i} ")
        assert len(streamed_on) == 6 and history.messages("c") == []
        gate.set()
        row.flush()
        (saved,) = history.messages("c")
        assert saved.text == "first w0 w1 w2 w3 w4 " and saved.interrupted
        assert row.writes == 2                    # the first text, then only the newest of the five
        row.finish(row.text + "end")
        assert [m.text for m in history.messages("c")] == ["first w0 w1 w2 w3 w4 end"]


def test_a_failed_write_while_streaming_is_reported_once_and_the_reply_goes_on(tmp_path):
    with HistoryDB(tmp_path / "h.sqlite3") as history:
        history.create_conversation("c", "t", "")
        errors, pieces = [], []

        def full(*args, **kwargs):
            raise sqlite3.OperationalError("database or disk is full")

        real_add = history.add_message
        history.add_message = full
        clock = FakeClock(0.0)
        row = StreamedReply(history, "c", clock=clock, forward=pieces.append, on_error=errors.append)
        for i in range(30):
            row.on_token(f"{i},")
            clock.now += 0.5
        row.flush()                                  # the writer thread's failure, reported here at the latest
        assert len(errors) == 1 and len(pieces) == 30 and row.row_id is None
        with pytest.raises(ReplySaveError, match="could not be saved"):
            row.finish(row.text)
        history.add_message = real_add
        row.finish(row.text)                         # the disk has room again: the whole reply is saved
        assert [m.text for m in history.messages("c")] == [row.text]


# -- c: a reply whose row fails to save rolls the turn back ---------------------------------------------------------
@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    with Engine(_settings(tmp_path_factory.mktemp("crash")), scheduler=False, prewarm=False) as eng:
        yield eng


def _fail_reply_rows(monkeypatch, engine: Engine, method: str) -> None:
    """The history raises "disk full" when it writes a reply row (`add_message`) or rewrites one (`update_message`)."""
    real = getattr(engine.history, method)

    def failing(conversation_id, *args, **kwargs):
        role = args[0] if method == "add_message" else "assistant"
        if role == "assistant":
            raise sqlite3.OperationalError("database or disk is full")
        return real(conversation_id, *args, **kwargs)

    monkeypatch.setattr(engine.history, method, failing)


@pytest.mark.parametrize("method", ["add_message", "update_message"])
def test_a_reply_that_cannot_be_saved_rolls_the_turn_back(engine, monkeypatch, method):
    conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
    conv.send("Read this.", [("nodes.txt", DOC)], max_tokens=8, temperature=0)
    before = [(m["role"], m["text"]) for m in conv.messages()]
    events = []
    engine.subscribe(events.append)
    with monkeypatch.context() as patch:
        _fail_reply_rows(patch, engine, method)
        with pytest.raises(EvokeError, match="reply could not be saved.*rolled back"):
            conv.send("What does node 5 hold?", max_tokens=24, temperature=0)
    assert [(m["role"], m["text"]) for m in conv.messages()] == before          # no orphan user row
    hidden = [m for m in engine.history.messages(conv.id, include_hidden=True) if m.status == DELETED]
    assert [m.role for m in hidden] == (["user"] if method == "add_message" else ["user", "assistant"])
    _agrees(engine, conv)
    assert any(e.kind == EventKind.ERROR and "rolled back" in e.message for e in events)
    conv.send("What does node 7 hold?", max_tokens=8, temperature=0)            # the next turn goes on
    assert len(conv.messages()) == len(before) + 2
    _agrees(engine, conv)


def test_a_regenerated_reply_that_cannot_be_saved_keeps_the_old_one(engine, monkeypatch):
    conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
    conv.send("Read this.", [("nodes.txt", DOC)], max_tokens=8, temperature=0)
    before = [(m["role"], m["text"]) for m in conv.messages()]
    with monkeypatch.context() as patch:
        _fail_reply_rows(patch, engine, "add_message")
        with pytest.raises(EvokeError, match="reply could not be saved"):
            conv.regenerate(max_tokens=8, temperature=0.9, seed=3).result()
    assert [(m["role"], m["text"]) for m in conv.messages()] == before
    _agrees(engine, conv)


# -- a: a KV file written before the last messages is used, only the rest decoded --------------------------------
def test_a_cache_file_written_before_the_last_message_is_used_and_only_the_tail_decoded(tmp_path):
    with Engine(_settings(tmp_path), scheduler=False, prewarm=False) as engine:
        conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
        conv.send("Read this.", [("nodes.txt", DOC)], max_tokens=8, temperature=0)
        conv.send("What does node 5 hold?", max_tokens=8, temperature=0)
        assert engine.persist(conv.id)
        conv.send("And node 9?", max_tokens=8, temperature=0)
        engine.release_conversation(conv.id, persist=False)          # as after a kill: the file is older
        events = []
        engine.subscribe(events.append)
        engine.open_conversation(conv.id)
        kinds = [e.kind for e in events]
        assert EventKind.KV_RESTORED in kinds and EventKind.KV_REBUILT not in kinds
        progress = [e for e in events if e.kind == EventKind.KV_REBUILDING]
        tail = progress[-1].detail
        assert tail["done"] == tail["total"] == progress[-1].tokens and tail["messages"] == 2
        whole = sum(len(engine.tokenize(m["text"] + "".join(b for _, b in m["attachments"])))
                    for m in conv.messages())
        assert 0 < tail["done"] < whole / 5, (tail, whole)              # the question and its reply only
        _agrees(engine, conv)
        assert conv.send("And node 11?", max_tokens=8, temperature=0)
        _agrees(engine, conv)


# -- a: kill -9 in the middle of a reply ---------------------------------------------------------------------
@pytest.mark.slow
def test_a_reply_killed_mid_stream_is_kept_up_to_a_second_before_and_the_chat_goes_on(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, str(ROOT / "tests" / "helpers" / "crash_child.py"), str(tmp_path)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    lines: list[dict] = []
    killer = threading.Timer(280, child.kill)                     # a hung child fails the test, never hangs it
    killer.start()
    try:
        for raw in child.stdout:
            lines.append(json.loads(raw))
            assert "done" not in lines[-1], "the reply ended before the kill: make it longer"
            pieces = [line for line in lines if "piece" in line]
            if pieces and pieces[-1]["t"] - pieces[0]["t"] > 3.0:
                os.kill(child.pid, signal.SIGKILL)
                break
        lines += [json.loads(raw) for raw in child.stdout.read().splitlines() if raw.strip()]
    finally:
        killer.cancel()
        child.kill()
        child.wait()
    conversation_id = lines[0]["id"]
    pieces = [line for line in lines if "piece" in line]
    streamed = "".join(p["piece"] for p in pieces)
    must_have = "".join(p["piece"] for p in pieces if p["t"] < pieces[-1]["t"] - 1.5)

    with Engine(_settings(tmp_path), scheduler=False, prewarm=False) as engine:
        events = []
        engine.subscribe(events.append)
        conv = engine.open_conversation(conversation_id)
        *_, question, partial = conv.messages()
        assert question["role"] == "user" and partial["role"] == "assistant"
        assert partial["interrupted"] and len(must_have) > 0
        assert streamed.startswith(partial["text"]) or partial["text"].startswith(streamed)   # one piece ahead
        assert partial["text"].startswith(must_have)
        kinds = [e.kind for e in events]
        assert EventKind.KV_RESTORED in kinds and EventKind.KV_REBUILT not in kinds
        tail = [e for e in events if e.kind == EventKind.KV_REBUILDING][-1].detail
        whole = sum(len(engine.tokenize(m["text"] + "".join(b for _, b in m["attachments"])))
                    for m in conv.messages())
        assert tail["messages"] == 2 and tail["done"] < whole / 2, (tail, whole)
        _agrees(engine, conv)
        conv.send("Which port does line 7 use?", max_tokens=8, temperature=0)
        assert not any(m["interrupted"] for m in conv.messages()[-2:])
        assert conv.messages()[-3]["interrupted"]                 # the cut reply stays marked as such
        _agrees(engine, conv)


# -- b: an imported conversation's first reply counts its rebuild ---------------------------------------------------
def test_an_imported_conversations_first_reply_counts_its_rebuild(engine):
    source = engine.new_conversation(system_prompt="You are brief.", tools=[])
    source.send("Read this.", [("nodes.txt", DOC)], max_tokens=8, temperature=0)
    source.send("What does node 5 hold?", max_tokens=8, temperature=0)
    clone = engine.import_conversation(source.export("json"))
    progress, stats_seen = [], []

    def watch(event) -> None:
        if event.kind == EventKind.KV_REBUILDING and event.conversation_id == clone.id:
            progress.append(event.detail)
            stats_seen.append(clone.stats().active_tokens)       # the memory panel reads something meanwhile

    engine.subscribe(watch)
    reply = clone.submit("And node 9?", max_tokens=8, temperature=0).result()
    assert len(progress) >= 3 and progress[0]["done"] == 0
    assert [p["done"] for p in progress] == sorted(p["done"] for p in progress)
    assert progress[-1]["done"] == progress[-1]["total"] == reply.rebuilt_tokens > 400
    assert max(stats_seen) > 0
    assert reply.rebuild_s > 0 and reply.ttft_s >= reply.rebuild_s
    second = clone.submit("And node 11?", max_tokens=8, temperature=0).result()
    assert second.rebuilt_tokens == 0 and second.rebuild_s == 0
    _agrees(engine, clone)
