"""`bench switch`, `bench reopen`, `bench prewarm`: time to first token where conversations meet the KV cache.

Invariant: each compares two ways of serving the same messages, measured in one run on one
model; time to first token is wall-clock from the request to the first streamed piece.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from ..engine import Engine
from ..prefixes import default_tools
from ..runtime import default_model_path, safe_model_params
from ..settings import Settings

SYSTEM = "You are a careful assistant. Answer briefly."
SHORT = ["Which section mentions the cache?", "What does section 4 configure?", "Summarise section 2 briefly.",
         "Is there a timeout setting here?", "Which port is used in section 7?", "Name one log file here."]


def document(tag: str, n_tokens_hint: int) -> str:
    lines, i = [], 0
    while len(" ".join(lines)) < n_tokens_hint * 4.2:
        lines.append(f"Section {i} of {tag}: the worker on port {7000 + i} reads config key {tag}.{i} and "
                     f"retries {i % 5 + 1} times before logging to {tag}-{i}.log.")
        i += 1
    return "\n".join(lines)


def comparator_llama(**kwargs):
    """llama-cpp-python's `Llama` on the embedded model, loaded with the engine's AMX guard
    (`runtime.safe_model_params`): without it the comparator crashes where the engine does not."""
    from llama_cpp import Llama, llama_cpp

    original = llama_cpp.llama_model_default_params
    llama_cpp.llama_model_default_params = safe_model_params
    try:
        return Llama(model_path=str(default_model_path()), verbose=False, **kwargs)
    finally:
        llama_cpp.llama_model_default_params = original


def _ttft(conv, text: str) -> float:
    first: list[float] = []
    start = time.perf_counter()
    conv.submit(text, on_token=lambda _: first or first.append(time.perf_counter()), max_tokens=2,
                temperature=0).result()
    return (first[0] if first else time.perf_counter()) - start


def run_switch(tokens: int | None = None, trials: int = 3) -> dict:
    tokens = tokens or 2000
    home = tempfile.mkdtemp(prefix="evoke-bench-")
    settings = Settings(home=home, budget_tokens=tokens + 1024, n_ctx=4 * (tokens + 1024), slots=2,
                        recovery="kv_restore", system_prompt=SYSTEM, tools_enabled=False)
    docs = {"A": document("alpha", tokens), "B": document("beta", tokens)}
    ours, theirs, sizes = [], [], {}
    with Engine(settings, scheduler=False) as engine:
        engine.wait_idle()
        convs = {}
        for name, doc in docs.items():
            convs[name] = engine.new_conversation(system_prompt=SYSTEM, tools=[])
            convs[name].send("Read this file and reply OK.", [(f"{name}.txt", doc)], max_tokens=4, temperature=0)
            sizes[name] = convs[name].stats().active_tokens
        engine.wait_idle()
        histories = {name: [{"role": "system", "content": SYSTEM}, *conv.template_history()]
                     for name, conv in convs.items()}
        order = ["A", "B"] * (trials + 1)
        for i, name in enumerate(order):
            ours.append({"conversation": name, "ttft_s": _ttft(convs[name], SHORT[i % len(SHORT)])})
    llm = comparator_llama(n_ctx=settings.n_ctx, n_threads=os.cpu_count(), n_batch=settings.n_batch)
    for i, name in enumerate(order):
        messages = [*histories[name], {"role": "user", "content": SHORT[i % len(SHORT)]}]
        start = time.perf_counter()
        for chunk in llm.create_chat_completion(messages=messages, max_tokens=2, temperature=0, stream=True):
            if chunk["choices"][0]["delta"].get("content"):
                break
        theirs.append({"conversation": name, "ttft_s": time.perf_counter() - start})
    ours_switches = [r["ttft_s"] for r in ours[1:]]
    theirs_switches = [r["ttft_s"] for r in theirs[1:]]
    return {"bench": "switch", "conversation_tokens": sizes, "switches": len(ours_switches),
            "evoke_ttft_s": [round(x, 4) for x in ours_switches],
            "llama_cpp_python_ttft_s": [round(x, 3) for x in theirs_switches],
            "evoke_median_s": round(statistics.median(ours_switches), 4),
            "llama_cpp_python_median_s": round(statistics.median(theirs_switches), 3),
            "speedup": round(statistics.median(theirs_switches) / statistics.median(ours_switches), 1),
            "baseline": "llama_cpp.Llama.create_chat_completion, both conversations in one Llama"}


REOPEN_CHILD = r"""
import json, sys, time
from evoke_engine import Engine, Settings
from evoke_engine.bench.conversations import _ttft, SHORT, SYSTEM
home, cid, budget, n_ctx, trials = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
out = {"reopen": [], "reprefill": []}
settings = Settings(home=home, budget_tokens=budget, n_ctx=n_ctx, slots=2, system_prompt=SYSTEM,
                    tools_enabled=False)
with Engine(settings, scheduler=False) as engine:
    engine.wait_idle()
    for trial in range(trials):
        start = time.perf_counter()
        conv = engine.open_conversation(cid)
        opened = time.perf_counter() - start
        out.setdefault("open_only", []).append(opened)
        out["reopen"].append(opened + _ttft(conv, SHORT[trial]))
        engine.release_conversation(cid, persist=False)      # freed; its file stays as it was
    for trial in range(trials):
        payload = engine.kvfiles.read(cid)
        engine.kvfiles.remove(cid)                           # no file: the history is re-prefilled
        start = time.perf_counter()
        conv = engine.open_conversation(cid)
        out["reprefill"].append(time.perf_counter() - start + _ttft(conv, SHORT[trial]))
        engine.release_conversation(cid, persist=False)
        engine.kvfiles.write(cid, "long", payload)           # the next trial reopens the same state
print(json.dumps(out))
"""


def run_reopen(tokens: int | None = None, trials: int = 3) -> dict:
    tokens = tokens or 2000
    home = tempfile.mkdtemp(prefix="evoke-bench-")
    budget, n_ctx = tokens + 1024, 4 * (tokens + 1024)
    settings = Settings(home=home, budget_tokens=budget, n_ctx=n_ctx, slots=2, system_prompt=SYSTEM,
                        tools_enabled=False)
    with Engine(settings, scheduler=False) as engine:
        conv = engine.new_conversation(system_prompt=SYSTEM, tools=[])
        conv.send("Read this file and reply OK.", [("notes.txt", document("gamma", tokens))], max_tokens=4,
                  temperature=0)
        size = conv.stats().active_tokens
        cid = conv.id
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    out: dict[str, list[float]] = {"reopen": [], "reprefill": [], "open_only": []}
    for _ in range(trials):                                  # every trial: a fresh process, then a reopen
        proc = subprocess.run([sys.executable, "-c", REOPEN_CHILD, home, cid, str(budget), str(n_ctx), "1"],
                              capture_output=True, text=True, env=env, check=True)
        for key, values in json.loads(proc.stdout.strip().splitlines()[-1]).items():
            if key in out:
                out[key] += values
    reopen, reprefill = statistics.median(out["reopen"]), statistics.median(out["reprefill"])
    return {"bench": "reopen", "conversation_tokens": size, "fresh_process_per_trial": True,
            "reopen_ttft_s": [round(x, 4) for x in out["reopen"]],
            "reprefill_ttft_s": [round(x, 3) for x in out["reprefill"]],
            "open_only_s": [round(x, 4) for x in out["open_only"]],
            "reopen_median_s": round(reopen, 4), "reprefill_median_s": round(reprefill, 3),
            "speedup": round(reprefill / reopen, 1)}


def long_system_prompt(n_tokens: int) -> str:
    rules = [f"Rule {i}: when the user asks about module {i}, check its configuration, its tests and its "
             f"error handling before answering, and mention file src/module_{i}.py by name." for i in range(200)]
    text = "You are Evoke, a careful local coding assistant.\n"
    for rule in rules:
        if len(text) > n_tokens * 3.6:
            break
        text += rule + "\n"
    return text


def _decode_user_tokens_only(engine: Engine, message: str) -> float:
    """The floor: decode the user's tokens (and the generation prompt) on the cached prefix, sample one."""
    import numpy as np

    conv = engine.new_conversation(title="floor")
    memory, rt, template = engine.lifecycle.open(conv.id).memory, engine.rt, engine.template
    user = {"role": "user", "content": message}
    text = template.segment([], user) + template.assistant_frame([user]).opening
    start = time.perf_counter()
    tokens = rt.tokenize(text)
    rt.decode(tokens, memory.seq, memory.active_tokens)
    int(np.argmax(rt.logits()))
    elapsed = time.perf_counter() - start
    engine.delete_conversation(conv.id)
    return elapsed


def run_prewarm(tokens: int | None = None, trials: int = 5) -> dict:
    tokens = tokens or 1000
    home = tempfile.mkdtemp(prefix="evoke-bench-")
    system = long_system_prompt(tokens - 350)
    settings = Settings(home=home, budget_tokens=4096, n_ctx=8192, slots=2, system_prompt=system,
                        tools_enabled=True)
    rows: dict[str, list[float]] = {"prewarmed": [], "cold": [], "user_only": []}   # user_only: the floor
    prefix_tokens = 0
    for trial in range(trials):
        message = SHORT[trial]
        with Engine(settings, scheduler=False, prewarm=True) as engine:
            engine.wait_idle()
            start = time.perf_counter()
            conv = engine.new_conversation()
            rows["prewarmed"].append(time.perf_counter() - start + _ttft(conv, message))
            prefix_tokens = conv.stats().prefix_tokens
            rows["user_only"].append(engine.thread.call(_decode_user_tokens_only, engine, message))
        with Engine(settings, scheduler=False, prewarm=False) as engine:
            engine.embedder.warm()
            start = time.perf_counter()
            conv = engine.new_conversation()
            rows["cold"].append(time.perf_counter() - start + _ttft(conv, message))
    med = {k: statistics.median(v) for k, v in rows.items()}
    return {"bench": "prewarm", "prefix_tokens": prefix_tokens, "tools": len(default_tools()),
            **{f"{k}_ttft_s": [round(x, 4) for x in v] for k, v in rows.items()},
            **{f"{k}_median_s": round(v, 4) for k, v in med.items()},
            "prewarmed_over_user_only": round(med["prewarmed"] / med["user_only"], 2),
            "cold_over_prewarmed": round(med["cold"] / med["prewarmed"], 1)}
