"""`bench switch`: time to first token when a user alternates between two long conversations, against
what a user would pick instead, all measured in one run: the floor, llama-server, llama-cpp-python.

Invariants: every system serves the same two histories and the same short messages in the same
A/B order; the first request of each system warms it and is not counted; medians of the rest.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import llama_cpp as ll
import numpy as np

from ..engine import Engine
from ..runtime import Runtime
from ..settings import Settings
from ..template import ChatTemplate
from .conversations import SHORT, SYSTEM, _ttft, comparator_llama, document
from .llama_server import LlamaServer


def _floor(histories: dict[str, list[dict]], order: list[str], n_ctx: int, threads: int) -> list[float]:
    """Decode only the new tail (the message and the reply's opening) on a cached context, sample one."""
    rt = Runtime(Settings(n_ctx=n_ctx, slots=2, n_threads=threads, home=tempfile.mkdtemp(prefix="evoke-floor-")))
    try:
        template = ChatTemplate(rt.meta("tokenizer.chat_template"), bos_token=rt.token_text("bos"),
                                eos_token=rt.token_text("eos"))
        seqs, ends = {}, {}
        for seq, (name, history) in enumerate(histories.items()):
            tokens = rt.tokenize(template.render(history))
            rt.decode(tokens, seq, 0, logits_last=False)
            seqs[name], ends[name] = seq, len(tokens)
        out = []
        for i, name in enumerate(order):
            message = {"role": "user", "content": SHORT[i % len(SHORT)]}
            tail = (template.segment(histories[name], message)
                    + template.assistant_frame([*histories[name], message]).opening)
            start = time.perf_counter()
            rt.decode(rt.tokenize(tail), seqs[name], ends[name])
            int(np.argmax(rt.logits()))
            out.append(time.perf_counter() - start)
            ll.llama_memory_seq_rm(rt.memory, seqs[name], ends[name], -1)   # every switch sees the same context
        return out
    finally:
        rt.close()


def _llama_cpp_python(histories, order, n_ctx: int, threads: int, n_batch: int, ram_cache: bool) -> list[float]:
    from llama_cpp import LlamaRAMCache

    llm = comparator_llama(n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=n_batch)
    if ram_cache:
        llm.set_cache(LlamaRAMCache(capacity_bytes=8 << 30))
    out = []
    for i, name in enumerate(order):
        messages = [*histories[name], {"role": "user", "content": SHORT[i % len(SHORT)]}]
        start, first = time.perf_counter(), None
        for chunk in llm.create_chat_completion(messages=messages, max_tokens=2, temperature=0, stream=True):
            if first is None and chunk["choices"][0]["delta"].get("content"):
                first = time.perf_counter()
        out.append((first or time.perf_counter()) - start)   # drained: llama-cpp-python caches at the end
    llm.close()
    return out


def _server(binary: str, args: list[str], histories, order, n_ctx: int, threads: int, slots: bool) -> list[float]:
    with LlamaServer(binary, n_ctx=n_ctx, threads=threads, args=args) as server:
        slot_of = {name: k for k, name in enumerate(histories)}
        return [server.ttft([*histories[name], {"role": "user", "content": SHORT[i % len(SHORT)]}],
                            slot=slot_of[name] if slots else None)
                for i, name in enumerate(order)]


def run(tokens: int | None = None, trials: int = 7, server: str | None = None, threads: int = 0,
        reprefill: bool = True) -> dict:
    tokens = tokens or 2000
    threads = threads or os.cpu_count() or 1
    budget = tokens + 1024
    n_ctx = 4 * budget
    settings = Settings(home=tempfile.mkdtemp(prefix="evoke-bench-"), budget_tokens=budget, n_ctx=n_ctx, slots=2,
                        n_threads=threads, recovery="kv_restore", system_prompt=SYSTEM, tools_enabled=False)
    docs = {"A": document("alpha", tokens), "B": document("beta", tokens)}
    order = ["A", "B"] * (trials // 2 + 1)
    order = order[:trials + 1]
    times: dict[str, list[float]] = {}
    with Engine(settings, scheduler=False) as engine:
        engine.wait_idle()
        convs, sizes = {}, {}
        for name, doc in docs.items():
            convs[name] = engine.new_conversation(system_prompt=SYSTEM, tools=[])
            convs[name].send("Read this file and reply OK.", [(f"{name}.txt", doc)], max_tokens=4, temperature=0)
            sizes[name] = convs[name].stats().active_tokens
        engine.wait_idle()
        histories = {name: [{"role": "system", "content": SYSTEM}, *conv.template_history()]
                     for name, conv in convs.items()}
        times["evoke"] = [_ttft(convs[name], SHORT[i % len(SHORT)]) for i, name in enumerate(order)]
    times["floor"] = _floor(histories, order, n_ctx, threads)
    if server:
        n_ctx_server = 2 * n_ctx                     # llama-server splits -c between its slots
        times["llama_server_2_slots"] = _server(server, ["-np", "2", "--cache-ram", "0"], histories, order,
                                                n_ctx_server, threads, slots=True)
        times["llama_server_defaults"] = _server(server, [], histories, order, n_ctx_server, threads, slots=False)
        times["llama_server_1_slot_cache_ram"] = _server(server, ["-np", "1"], histories, order, n_ctx, threads,
                                                         slots=False)
    times["llama_cpp_python_ram_cache"] = _llama_cpp_python(histories, order, n_ctx, threads,
                                                            settings.n_batch, ram_cache=True)
    if reprefill:
        times["llama_cpp_python_reprefill"] = _llama_cpp_python(histories, order, n_ctx, threads,
                                                                settings.n_batch, ram_cache=False)
    medians = {k: statistics.median(v[1:]) for k, v in times.items()}
    floor = medians["floor"]
    servers = [v for k, v in medians.items() if k.startswith("llama_server")]
    return {"bench": "switch", "conversation_tokens": sizes, "switches": len(order) - 1, "threads": threads,
            "server": server or "not given: llama-server rows skipped",
            "rows": {k: {"median_ttft_s": round(v, 4), "vs_floor": round(v / floor, 2),
                         "ttft_s": [round(x, 4) for x in times[k][1:]]} for k, v in medians.items()},
            "evoke_vs_floor": round(medians["evoke"] / floor, 2),
            "evoke_vs_best_llama_server": round(medians["evoke"] / min(servers), 2) if servers else None,
            "speedup_vs_reprefill": (round(medians["llama_cpp_python_reprefill"] / medians["evoke"], 1)
                                     if reprefill else None)}
