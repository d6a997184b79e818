"""Child process for the crash tests: build a conversation, save its KV file, then stream a long reply until
the parent kills it (SIGKILL). Prints JSON lines: the conversation, then one line per streamed piece."""

from __future__ import annotations

import json
import sys
import threading
import time

from evoke_engine import Engine, Settings

DOC = "\n".join(f"Line {i}: the service at port {8000 + i} restarts nightly and logs to svc{i}.log."
                for i in range(60))
TURNS = [("Read this file.", [("services.txt", DOC)]), ("Which port does line 3 use?", [])]
LONG = "Write a long story about a dragon."
PIECE_DELAY_S = 0.015       # a slower machine: the stream lasts long enough to be killed in the middle


def settings(home: str) -> Settings:
    return Settings(home=home, budget_tokens=1024, n_ctx=4096, slots=2)


def stream(home: str) -> None:
    with Engine(settings(home), scheduler=False, prewarm=False) as engine:
        conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
        for text, attachments in TURNS:
            conv.send(text, attachments, max_tokens=16, temperature=0)
        engine.persist(conv.id)                          # the KV file: written before the last message
        print(json.dumps({"id": conv.id}), flush=True)

        def on_token(piece: str) -> None:                # after the reply's row was (maybe) written
            print(json.dumps({"t": time.monotonic(), "piece": piece}), flush=True)
            time.sleep(PIECE_DELAY_S)

        reply = conv.submit(LONG, on_token=on_token, max_tokens=3000, temperature=0, repeat_penalty=1.0).result()
        print(json.dumps({"done": reply.stopped}), flush=True)
        threading.Event().wait()                         # the parent kills us either way


if __name__ == "__main__":
    stream(sys.argv[1])
