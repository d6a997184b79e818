"""Child process for persistence tests: build, reopen or hammer a conversation in a given home."""

from __future__ import annotations

import json
import sys

from evoke_engine import Engine, Settings

DOC = "\n".join(f"Line {i}: the service at port {8000 + i} restarts nightly and logs to svc{i}.log."
                for i in range(40))
TURNS = [("Read this file.", [("services.txt", DOC)]), ("Which port does line 3 use?", [])]
NEXT = "And which port does line 7 use?"


def settings(home: str) -> Settings:
    # n_threads pinned: the automatic count follows the load average, and two processes that split the sums
    # over different thread counts may round logits apart (the restart test compares replies across processes)
    return Settings(home=home, budget_tokens=384, n_ctx=4096, slots=2, n_threads=2)


def build(home: str, then_ask: bool) -> dict:
    with Engine(settings(home), scheduler=False, prewarm=False) as engine:
        conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
        for text, attachments in TURNS:
            conv.send(text, attachments, max_tokens=16, temperature=0)
        out = {"id": conv.id, "evictions": conv.stats().evictions, "prefill": conv.stats().prefill_tokens}
        if then_ask:
            out["reply"] = conv.send(NEXT, max_tokens=16, temperature=0)
        return out


def reopen(home: str, conversation_id: str) -> dict:
    with Engine(settings(home), scheduler=False, prewarm=False) as engine:
        events = []
        engine.subscribe(lambda e: events.append(e.kind))
        conv = engine.open_conversation(conversation_id)
        conv.check()
        stats = conv.stats()
        reply = conv.send(NEXT, max_tokens=16, temperature=0)
        return {"reply": reply, "events": events, "active": stats.active_tokens,
                "prefill_after_open": stats.prefill_tokens}


def hammer(home: str) -> None:
    """Persist the same conversation over and over until killed."""
    with Engine(settings(home), scheduler=False, prewarm=False) as engine:
        conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
        for text, attachments in TURNS:
            conv.send(text, attachments, max_tokens=16, temperature=0)
        print(json.dumps({"id": conv.id}), flush=True)
        while True:
            engine.persist(conv.id)


if __name__ == "__main__":
    command, home = sys.argv[1], sys.argv[2]
    if command == "hammer":
        hammer(home)
    elif command == "build":
        print(json.dumps(build(home, then_ask=sys.argv[3] == "ask")))
    else:
        print(json.dumps(reopen(home, sys.argv[3])))
