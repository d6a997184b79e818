"""The KV disk cap on the real engine (issue 41, item 11): the write that crosses the cap deletes the least recently
used conversation's file, and that conversation reopens rebuilt from its history and answers."""

from __future__ import annotations

from evoke_engine import Engine, Settings
from evoke_engine.events import EventKind


def test_the_cap_deletes_the_least_recently_used_file_and_that_conversation_reopens_rebuilt(tmp_path):
    settings = Settings(home=str(tmp_path), budget_tokens=384, n_ctx=4096, slots=2, embedder="off")
    with Engine(settings, scheduler=False, prewarm=False) as engine:
        events: list[tuple[str, str | None]] = []
        engine.subscribe(lambda event: events.append((event.kind, event.conversation_id)))
        first = engine.new_conversation(system_prompt="You are brief.", tools=[])
        first.send("My code word is heron. Reply OK.", max_tokens=4, temperature=0)
        engine.release_conversation(first.id)
        one_file = engine.kvfiles.total_bytes()
        engine.apply_settings(engine.settings.replace(disk_budget_bytes=one_file * 3 // 2))   # room for one file
        second = engine.new_conversation(system_prompt="You are brief.", tools=[])
        second.send("Name a colour.", max_tokens=4, temperature=0)
        engine.release_conversation(second.id)                 # this write crosses the cap: the older file goes
        assert not engine.kvfiles.has(first.id) and engine.kvfiles.has(second.id)
        assert engine.kvfiles.total_bytes() <= one_file * 3 // 2

        del events[:]
        reopened = engine.open_conversation(first.id)
        mine = [kind for kind, conversation_id in events if conversation_id == first.id]
        assert EventKind.KV_REBUILDING in mine and EventKind.KV_RESTORED not in mine
        assert [m["text"] for m in engine.messages(first.id)][:1] == ["My code word is heron. Reply OK."]
        assert reopened.send("Say OK again.", max_tokens=4, temperature=0).strip()
        reopened.check()
        engine.release_conversation(first.id)                  # written again; now the other one is the oldest
        assert engine.kvfiles.has(first.id) and not engine.kvfiles.has(second.id)
