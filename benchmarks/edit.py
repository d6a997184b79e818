"""`bench edit`: time to first token of a regenerate, an edit 3 turns back and a fork, against re-prefill.

Invariant: on one ~2K-token conversation, measured in one run on one model; the baseline re-prefills
the same new history with llama-cpp-python (its cache reset before each request, as an app that
re-processes the prompt does); each of our trials edits a fork of the conversation, so every trial
starts from the same state.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

from evoke_engine.engine import Engine
from evoke_engine.settings import Settings

from .conversations import SHORT, SYSTEM, comparator_llama, document

EDITED = "Rather: which section mentions retries, and how many?"
NEW = "Which port does section 3 use?"


def _first_token(start: float, submit) -> float:
    first: list[float] = []
    submit(lambda _: first or first.append(time.perf_counter())).result()
    return (first[0] if first else time.perf_counter()) - start


def run(tokens: int | None = None, trials: int = 3) -> dict:
    tokens = tokens or 2000
    home = tempfile.mkdtemp(prefix="evoke-bench-")
    settings = Settings(home=home, budget_tokens=tokens + 1536, n_ctx=4 * (tokens + 1536), slots=4,
                        system_prompt=SYSTEM, tools_enabled=False)
    sampling = {"max_tokens": 2, "temperature": 0}
    ours: dict[str, list[float]] = {"regenerate": [], "edit_3_back": [], "fork": []}
    with Engine(settings, scheduler=False) as engine:
        engine.wait_idle()
        base = engine.new_conversation(system_prompt=SYSTEM, tools=[])
        base.send("Read this file and reply OK.", [("service.txt", document("svc", tokens - 400))], max_tokens=4,
                  temperature=0)
        for question in SHORT:
            base.send(question, max_tokens=40, temperature=0)
        engine.wait_idle()
        size = base.stats().active_tokens
        messages = base.messages()
        edit_index = len(messages) - 6                       # the user message 3 turns back
        for _ in range(trials):
            copy = base.fork(len(messages) - 1)
            ours["regenerate"].append(_first_token(time.perf_counter(),
                                                   lambda cb, c=copy: c.regenerate(on_token=cb, **sampling)))
            engine.delete_conversation(copy.id)
            copy = base.fork(len(messages) - 1)
            ours["edit_3_back"].append(_first_token(
                time.perf_counter(), lambda cb, c=copy: c.edit(edit_index, EDITED, on_token=cb, **sampling)))
            engine.delete_conversation(copy.id)
            start = time.perf_counter()
            child = base.fork(edit_index - 1)
            ours["fork"].append(_first_token(start, lambda cb, c=child: c.submit(NEW, on_token=cb, **sampling)))
            engine.delete_conversation(child.id)

    def as_chat(rows):
        return [{"role": "system", "content": SYSTEM}] + [
            {"role": m["role"], "content": "".join(f"[file {n}]\n{b.rstrip()}\n[end of file {n}]\n\n"
                                                   for n, b in m["attachments"]) + m["text"]} for m in rows]

    histories = {"regenerate": as_chat(messages[:-1]),
                 "edit_3_back": as_chat(messages[:edit_index]) + [{"role": "user", "content": EDITED}],
                 "fork": as_chat(messages[:edit_index]) + [{"role": "user", "content": NEW}]}
    llm = comparator_llama(n_ctx=settings.n_ctx, n_threads=os.cpu_count(), n_batch=settings.n_batch)
    theirs: dict[str, list[float]] = {name: [] for name in histories}
    for _ in range(max(1, trials - 1)):
        for name, history in histories.items():
            llm.reset()
            start = time.perf_counter()
            for chunk in llm.create_chat_completion(messages=history, stream=True, **sampling):
                if chunk["choices"][0]["delta"].get("content"):
                    break
            theirs[name].append(time.perf_counter() - start)
    result = {"bench": "edit", "conversation_tokens": size, "trials": trials,
              "baseline": "llama_cpp.Llama.create_chat_completion after reset(): the new history re-prefilled"}
    for name in ours:
        mine, base_s = statistics.median(ours[name]), statistics.median(theirs[name])
        result[name] = {"evoke_ttft_s": [round(x, 4) for x in ours[name]], "evoke_median_s": round(mine, 4),
                        "reprefill_ttft_s": [round(x, 3) for x in theirs[name]],
                        "reprefill_median_s": round(base_s, 3), "speedup": round(base_s / mine, 1)}
    return result
