"""`bench reopen`, `bench prewarm` (and the shared pieces of `bench switch`): time to first token where
conversations meet the KV cache.

Invariant: each compares two ways of serving the same messages, measured in one run on one
model; time to first token is wall-clock from the request to the first streamed piece.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from evoke_engine.engine import Engine
from evoke_engine.kvcache.prefixes import default_tools, system_message
from evoke_engine.runtime.runtime import default_model_path, safe_model_params
from evoke_engine.settings import Settings

from .isolated import IsolatedSystem

SYSTEM = "You are a careful assistant. Answer briefly."
PAUSE_S = 0.3           # idle before each timed request, for every system: a user pauses between messages
SHORT = ["Which section mentions the cache?", "What does section 4 configure?", "Summarise section 2 briefly.",
         "Is there a timeout setting here?", "Which port is used in section 7?", "Name one log file here.",
         "How many retries does section 9 allow?", "Which key does section 5 read?", "Is section 3 about logging?",
         "What happens after the last retry?", "Which section has the highest port?", "Where are errors written?"]


def document(tag: str, n_tokens_hint: int) -> str:
    lines, i = [], 0
    while len(" ".join(lines)) < n_tokens_hint * 4.2:
        lines.append(f"Section {i} of {tag}: the worker on port {7000 + i} reads config key {tag}.{i} and "
                     f"retries {i % 5 + 1} times before logging to {tag}-{i}.log.")
        i += 1
    return "\n".join(lines)


def comparator_llama(**kwargs):
    """llama-cpp-python's `Llama` on the embedded model, loaded with the engine's AMX guard
    (`runtime.safe_model_params`): without it the comparator crashes where the engine does not. On a GPU every
    layer goes there, as the engine's do (`Llama` keeps them on the CPU unless told). Its decodes run on the
    engine's compute thread (`_decode_on_compute_thread`)."""
    from llama_cpp import Llama, llama_cpp

    from evoke_engine.runtime import device

    kwargs.setdefault("n_gpu_layers", -1 if device.detect().on_gpu else 0)

    original = llama_cpp.llama_model_default_params
    llama_cpp.llama_model_default_params = safe_model_params
    try:
        llm = Llama(model_path=str(default_model_path()), verbose=False, **kwargs)
    finally:
        llama_cpp.llama_model_default_params = original
    _decode_on_compute_thread(llm)
    return llm


def _decode_on_compute_thread(llm) -> None:
    """The comparator's decodes run on the process's compute thread, as the engine's do (`runtime.compute_thread`):
    in a process where the engine's thread owns an OpenMP team, a second calling thread's team would make libgomp
    stop spinning for both (each barrier a futex sleep: 3-4x slower tokens on two cores), so in one process both
    systems compute in one team, as each would in a process of its own."""
    from evoke_engine.runtime import compute_thread

    context = llm._ctx

    def decode(batch) -> None:
        rc = compute_thread.llama_decode(context.ctx, batch.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    context.decode = decode


def first_token_s(conv, text: str) -> float:
    return first_token(conv, text)[0]


def first_token(conv, text: str) -> tuple[float, dict[str, float]]:
    """Seconds from submitting `text` to its first token, and the turn's own account of them (the reply's
    breakdown up to the first token, milliseconds per phase: decide, embed, restore, prompt_decode, python...)."""
    first: list[float] = []
    start = time.perf_counter()
    reply = conv.submit(text, on_token=lambda _: first or first.append(time.perf_counter()), max_tokens=2,
                        temperature=0).result()
    phases = (getattr(reply, "breakdown", None) or {}).get("first_token") or {}
    return (first[0] if first else time.perf_counter()) - start, {
        k.removesuffix("_s"): round(v * 1000, 2) for k, v in phases.items() if isinstance(v, float)}


def median_phases(rows: list[dict[str, float]]) -> dict[str, float]:
    """Each phase's median over `rows` (milliseconds), for a bench's JSON."""
    keys = sorted({k for row in rows for k in row})
    return {k: round(statistics.median(row.get(k, 0.0) for row in rows), 2) for k in keys} if rows else {}


REOPEN_CHILD = r"""
import json, sys, time
from evoke_engine import Engine, Settings
from benchmarks.conversations import first_token, SHORT, SYSTEM
home, cid, budget, n_ctx = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
what, trial = sys.argv[5].split(":")
message = SHORT[int(trial) % len(SHORT)]
settings = Settings(home=home, budget_tokens=budget, n_ctx=n_ctx, slots=2, system_prompt=SYSTEM,
                    tools_enabled=False)
with Engine(settings, scheduler=False) as engine:
    engine.wait_idle()
    n_saved = len(engine.history.messages(cid))
    if what == "reprefill":
        payload = engine.kvfiles.read(cid, refresh=False)
        engine.kvfiles.remove(cid)                           # no file: the history is re-prefilled
    start = time.perf_counter()
    conv = engine.open_conversation(cid)
    opened = time.perf_counter() - start
    if what == "reopen_typed":                 # the window: the turn prepared while it is typed (untimed)
        engine.prepare_ahead(cid, message, max_tokens=2).result()
    seconds, phases = first_token(conv, message)
    out = {what: [opened + seconds], f"{what}_phases": [phases],
           **({"open_only": [opened]} if what == "reopen" else {})}
    conv.truncate(n_saved)                                   # the chat as saved: the file still fits it
    engine.release_conversation(cid, persist=False)          # freed; its file stays as it was
    if what == "reprefill":
        engine.kvfiles.write(cid, "long", payload)           # the next trial reopens the same state
print(json.dumps(out))
"""


SERVER_FLASH = {"": [], "_fa_off": ["-fa", "off"]}     # llama-server's default (auto: on here) and off


def _slot_server(binary: str, n_ctx: int, extra: list[str], save_dir: str):
    """A one-slot llama-server (no host prompt cache) that saves and restores slots under `save_dir`."""
    from .llama_server import LlamaServer

    return LlamaServer(binary, n_ctx=n_ctx, threads=os.cpu_count() or 1, args=["-np", "1", "--cache-ram", "0", *extra],
                       slot_save_path=save_dir)


def _server_slot_file(binary: str, history: list[dict], n_ctx: int, extra: list[str]) -> str:
    """llama-server's way to keep a conversation across a restart: the slot saved to --slot-save-path."""
    save_dir = tempfile.mkdtemp(prefix="evoke-slots-")
    with _slot_server(binary, n_ctx, extra, save_dir) as server:
        server.ttft([*history, {"role": "user", "content": "Reply OK."}], slot=0)
        server.slot_action(0, "save", "conversation.bin")
    return save_dir


def _server_reopen(binary: str, save_dir: str, history: list[dict], n_ctx: int, extra: list[str],
                   message: str) -> float:
    """A fresh server process restores the saved slot, then answers the message: its reopen."""
    with _slot_server(binary, n_ctx, extra, save_dir) as server:
        restore = server.slot_action(0, "restore", "conversation.bin")
        return restore + server.ttft([*history, {"role": "user", "content": message}], slot=0)


def _evoke_reopen(home: str, cid: str, budget: int, n_ctx: int, what: str) -> dict[str, list[float]]:
    """One trial in a fresh process: `reopen` opens the conversation's file, `reprefill` rebuilds it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", REOPEN_CHILD, home, cid, str(budget), str(n_ctx), what],
                          capture_output=True, text=True, env=env, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _saved_conversation(tokens: int, budget: int, n_ctx: int) -> tuple[str, str, dict, list[dict]]:
    """A home holding one conversation (a long file, then a reply) persisted at `budget`: its home, id,
    sizes and the history a client would send."""
    home = tempfile.mkdtemp(prefix="evoke-bench-")
    settings = Settings(home=home, budget_tokens=budget, n_ctx=n_ctx, slots=2, system_prompt=SYSTEM,
                        tools_enabled=False)
    with Engine(settings, scheduler=False) as engine:
        conv = engine.new_conversation(system_prompt=SYSTEM, tools=[])
        conv.send("Read this file and reply OK.", [("notes.txt", document("gamma", tokens))], max_tokens=4,
                  temperature=0)
        stats = conv.stats()
        history = [{"role": "system", "content": SYSTEM}, *conv.template_history()]
        return home, conv.id, {"resident": stats.active_tokens, "in_file_ram_part": stats.cached_tokens}, history


def run_reopen(tokens: int | None = None, trials: int = 3, server: str | None = None) -> dict:
    tokens = tokens or 2000
    budget, whole_budget, n_ctx = tokens + 1024, 2 * tokens + 1024, 4 * (tokens + 1024)
    home, cid, size, history = _saved_conversation(tokens, budget, n_ctx)
    whole_home, whole_cid, whole_size, _ = _saved_conversation(tokens, whole_budget, n_ctx)
    slot_files = {suffix: _server_slot_file(server, history, n_ctx, extra)
                  for suffix, extra in SERVER_FLASH.items()} if server else {}
    out: dict[str, list] = {"reopen": [], "open_only": [], "reprefill": [], "reopen_whole": [], "reopen_typed": []}
    phases: dict[str, list[dict]] = {"reopen": [], "reopen_whole": [], "reopen_typed": []}
    servers: dict[str, list[float]] = {suffix: [] for suffix in slot_files}
    for trial in range(trials):              # the systems take turns, rotating who goes first
        turns = [("evoke", None), ("evoke_whole", None), ("evoke_typed", None),
                 *((suffix, extra) for suffix, extra in SERVER_FLASH.items() if server)]
        for label, extra in turns[trial % len(turns):] + turns[:trial % len(turns)]:
            if label == "evoke":
                got = _evoke_reopen(home, cid, budget, n_ctx, f"reopen:{trial}")
                out["reopen"] += got["reopen"]
                out["open_only"] += got["open_only"]
                phases["reopen"] += got["reopen_phases"]
            elif label == "evoke_typed":
                got = _evoke_reopen(home, cid, budget, n_ctx, f"reopen_typed:{trial}")
                out["reopen_typed"] += got["reopen_typed"]
                phases["reopen_typed"] += got["reopen_typed_phases"]
            elif label == "evoke_whole":
                got = _evoke_reopen(whole_home, whole_cid, whole_budget, n_ctx, f"reopen:{trial}")
                out["reopen_whole"] += got["reopen"]
                phases["reopen_whole"] += got["reopen_phases"]
            else:
                servers[label].append(_server_reopen(server, slot_files[label], history, n_ctx, extra,
                                                     SHORT[trial % len(SHORT)]))
    for trial in range(trials):
        out["reprefill"] += _evoke_reopen(home, cid, budget, n_ctx, f"reprefill:{trial}")["reprefill"]
    reopen, reprefill = statistics.median(out["reopen"]), statistics.median(out["reprefill"])
    server_rows: dict = {}
    for suffix, restored in servers.items():
        server_rows[f"llama_server_slot_restore{suffix}_ttft_s"] = [round(x, 4) for x in restored]
        server_rows[f"llama_server_slot_restore{suffix}_median_s"] = round(statistics.median(restored), 4)
    whole = statistics.median(out["reopen_whole"])
    if servers:
        best = min(statistics.median(v) for v in servers.values())
        server_rows["evoke_vs_best_llama_server"] = round(reopen / best, 2)
        server_rows["evoke_whole_vs_best_llama_server"] = round(whole / best, 2)
    return {"bench": "reopen", "conversation_tokens": size, "fresh_process_per_trial": True,
            "interleaved": bool(servers), **server_rows,
            "whole_conversation_tokens": whole_size,          # budget 2*tokens+1024: nothing to recover
            "reopen_whole_ttft_s": [round(x, 4) for x in out["reopen_whole"]],
            "reopen_whole_median_s": round(whole, 4),
            "reopen_ttft_s": [round(x, 4) for x in out["reopen"]],
            "reprefill_ttft_s": [round(x, 3) for x in out["reprefill"]],
            "open_only_s": [round(x, 4) for x in out["open_only"]],
            "reopen_median_s": round(reopen, 4), "reprefill_median_s": round(reprefill, 3),
            "speedup": round(reprefill / reopen, 1), "reopen_over_whole": round(reopen / whole, 2),
            # the window's way: the turn prepared while it was typed, after the open (Engine.prepare_ahead)
            "reopen_typed_ttft_s": [round(x, 4) for x in out["reopen_typed"]],
            "reopen_typed_median_s": round(statistics.median(out["reopen_typed"]), 4),
            "reopen_typed_over_whole": round(statistics.median(out["reopen_typed"]) / whole, 2),
            # each first turn's own account of its first token (ms per phase, medians): where a reopen's time went
            "first_token_phases_ms": {k: median_phases(v) for k, v in phases.items()}}


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
    state, rt, template = engine.lifecycle.open(conv.id), engine.diagnostics().rt, engine.diagnostics().template
    memory, system, user = state.memory, state.system_message, {"role": "user", "content": message}
    text = template.segment([system], user) + template.assistant_frame([system, user]).opening
    engine.diagnostics().kv.drop(memory.seq, memory.active_tokens, -1)    # the opening held ahead: the floor decodes it
    start = time.perf_counter()
    tokens = rt.tokenize(text)
    rt.decode(tokens, memory.seq, memory.active_tokens)
    int(np.argmax(rt.logits()))
    elapsed = time.perf_counter() - start
    engine.delete_conversation(conv.id)
    return elapsed


def _server_prewarmed(stack: contextlib.ExitStack, binary: str, system: dict, extra: list[str]):
    """llama-server's nearest thing to a prewarm: an earlier request left the system prompt in its
    prompt cache (defaults), and each new conversation's first message reuses it. Returns `ask(message)`."""
    from .llama_server import LlamaServer

    server = stack.enter_context(LlamaServer(binary, n_ctx=8192, threads=os.cpu_count() or 1, args=extra))
    server.ttft([system, {"role": "user", "content": "Hello."}])
    return lambda message: server.ttft([system, {"role": "user", "content": message}])


class PrewarmTrial:
    """One trial of `bench prewarm`, in a process of its own (`IsolatedSystem`), as the app starts."""

    def __init__(self, settings: Settings) -> None:
        self.settings, self._prefix_tokens = settings, 0

    def run(self, message: str) -> dict[str, float]:
        out = {}
        with Engine(self.settings, scheduler=False, prewarm=True) as engine:
            engine.wait_idle()
            time.sleep(PAUSE_S)
            start = time.perf_counter()
            conv = engine.new_conversation()
            out["prewarmed"] = time.perf_counter() - start + first_token_s(conv, message)
            self._prefix_tokens = conv.stats().prefix_tokens
            time.sleep(PAUSE_S)
            out["user_only"] = engine.thread.call(_decode_user_tokens_only, engine, message)
        with Engine(self.settings, scheduler=False, prewarm=False) as engine:
            engine.diagnostics().embedder.warm()
            time.sleep(PAUSE_S)
            start = time.perf_counter()
            conv = engine.new_conversation()
            out["cold"] = time.perf_counter() - start + first_token_s(conv, message)
        return out

    def prefix_tokens(self) -> int:
        return self._prefix_tokens


def run_prewarm(tokens: int | None = None, trials: int = 5, server: str | None = None) -> dict:
    tokens = tokens or 1000
    home = tempfile.mkdtemp(prefix="evoke-bench-")
    system = long_system_prompt(tokens - 350)
    settings = Settings(home=home, budget_tokens=4096, n_ctx=8192, slots=2, system_prompt=system,
                        tools_enabled=True)
    rows: dict[str, list[float]] = {"prewarmed": [], "cold": [], "user_only": []}   # user_only: the floor
    prefix_tokens = 0

    def evoke_trial(message: str) -> None:
        nonlocal prefix_tokens
        trial = IsolatedSystem(PrewarmTrial, settings)         # a fresh process: the app starting
        try:
            for key, value in trial.call("run", message).items():
                rows[key].append(value)
            prefix_tokens = trial.call("prefix_tokens")
        finally:
            trial.close()

    with contextlib.ExitStack() as stack:
        systems = {"evoke": evoke_trial}
        for suffix, extra in (SERVER_FLASH.items() if server else ()):
            label = f"llama_server_cached_system{suffix}"
            rows[label] = []
            ask = _server_prewarmed(stack, server, system_message(system, default_tools()), extra)
            systems[label] = lambda message, ask=ask, label=label: rows[label].append(ask(message))
        labels = list(systems)
        for trial in range(trials):          # the systems take turns, rotating who goes first
            for label in labels[trial % len(labels):] + labels[:trial % len(labels)]:
                time.sleep(PAUSE_S)          # as before every request: no system is timed on hot threads
                systems[label](SHORT[trial % len(SHORT)])
    med = {k: statistics.median(v) for k, v in rows.items()}
    best_server = min((v for k, v in med.items() if k.startswith("llama_server")), default=None)
    return {"bench": "prewarm", "prefix_tokens": prefix_tokens, "tools": len(default_tools()),
            "interleaved": bool(server),
            **{f"{k}_ttft_s": [round(x, 4) for x in v] for k, v in rows.items()},
            **{f"{k}_median_s": round(v, 4) for k, v in med.items()},
            "prewarmed_over_user_only": round(med["prewarmed"] / med["user_only"], 2),
            "cold_over_prewarmed": round(med["cold"] / med["prewarmed"], 1),
            **({"prewarmed_over_best_llama_server": round(med["prewarmed"] / best_server, 2)}
               if best_server else {})}
