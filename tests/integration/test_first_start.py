"""The first start with an empty cache (issue 58 item 11): the embedder is exported on a thread of its own while the
first reply runs, never on the engine thread; events say it is being prepared for its first use and when it is ready.

Invariants: the export happens (no ONNX file in the fresh cache) and the reply ends while it is still running;
recall meanwhile matches words (`Embedder.warming`), and once ready the embedder embeds."""

from __future__ import annotations

import threading

from evoke_engine import Engine, EventKind, Settings


def test_the_first_reply_never_waits_for_the_embedder_being_prepared(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))        # no exported embedder: a first start's
    warming, ready = threading.Event(), threading.Event()
    seen: list = []

    def note(event) -> None:
        if event.kind == EventKind.EMBEDDER_WARMING:
            seen.append(event)
            warming.set()
        elif event.kind == EventKind.EMBEDDER_READY:
            seen.append(event)
            ready.set()
    with Engine(Settings(home=str(tmp_path / "home")), wait=False) as engine:
        engine.subscribe(note)
        engine.ready.result(timeout=300)
        assert warming.wait(60) and seen[0].detail == {"first_use": True}
        conv = engine.new_conversation()                                  # the old engine-thread job held this
        reply = conv.submit("Say hi in three words.", max_tokens=6, temperature=0).result(timeout=120)
        assert reply.n_tokens > 0 and not ready.is_set(), "the reply waited for the embedder's export"
        assert engine.model.embedder.warming
        assert ready.wait(300) and seen[-1].detail["error"] is None
        assert engine.model.embedder.embed(["the harbour wall"]).shape[0] == 1
