"""`bench switch`: time to first token when a user alternates between two long conversations, against
what a user would pick instead, all measured in one run: the floor, llama-server, llama-cpp-python.

Invariants: every system serves the same two histories and the same short messages (a new one at each
switch) in the same A/B order; every system is warmed on both conversations before anything is timed;
the systems take turns at each switch (rotating who goes first, a pause between requests), so a drift
of the machine's speed lands on all of them alike; medians over the switches. Every system runs in a
process of its own, as llama-server does and as the app runs Evoke; the timings come from inside it.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time

import llama_cpp as ll
import numpy as np

from evoke_engine.engine import Engine
from evoke_engine.runtime.rpc_worker import bench_workers, even_split
from evoke_engine.runtime.runtime import Runtime
from evoke_engine.runtime.template import ChatTemplate
from evoke_engine.settings import Settings

from .conversations import PAUSE_S, SHORT, SYSTEM, comparator_llama, document, first_token, median_phases
from .isolated import IsolatedSystem
from .llama_server import LlamaServer

WARM = ["Reply OK if you can read this.", "Please reply OK once more."]


class EvokeSystem:
    """Evoke Desk: each conversation in its slot; at `budget` both fit, or part of each is in RAM."""

    def __init__(self, docs: dict[str, str], budget: int, threads: int, rpc_servers: str = "",
                 typed_ahead: bool = False) -> None:
        self.typed_ahead = typed_ahead       # the window's way: each message embedded while it was typed
        settings = Settings(home=tempfile.mkdtemp(prefix="evoke-bench-"), budget_tokens=budget, n_ctx=4 * budget,
                            slots=2, n_threads=threads, recovery="kv_restore", system_prompt=SYSTEM,
                            tools_enabled=False, rpc_servers=rpc_servers,
                            rpc_layer_split=even_split(rpc_servers) if rpc_servers else "")
        self.engine = Engine(settings, scheduler=False)
        self.engine.wait_idle()
        self.phases: list[dict[str, float]] = []
        self.convs = {}
        for name, doc in docs.items():
            self.convs[name] = self.engine.new_conversation(system_prompt=SYSTEM, tools=[])
            self.convs[name].send("Read this file and reply OK.", [(f"{name}.txt", doc)], max_tokens=4,
                                  temperature=0)

    def layout(self) -> dict:
        info = self.engine.model_info()
        return {"contexts": info.contexts, "flash_attention": info.flash_attention}

    def histories(self) -> dict[str, list[dict]]:
        return {name: [{"role": "system", "content": SYSTEM}, *conv.template_history()]
                for name, conv in self.convs.items()}

    def sizes(self) -> dict[str, dict[str, int]]:
        stats = {name: conv.stats() for name, conv in self.convs.items()}
        return {name: {"resident": s.active_tokens, "in_ram_or_disk": s.cached_tokens} for name, s in stats.items()}

    def ask(self, name: str, message: str) -> float:
        if self.typed_ahead:
            self.engine.prepare_ahead(self.convs[name].id, message, max_tokens=2).result()   # untimed: typing
        seconds, phases = first_token(self.convs[name], message)
        self.phases.append(phases)
        return seconds

    def first_token_phases(self, skip: int) -> dict[str, float]:
        """Medians of the turns' own accounts of their first tokens (ms per phase), after the first `skip`."""
        return median_phases(self.phases[skip:])

    def close(self) -> None:
        self.engine.close()


class FloorSystem:
    """The floor: decode only the new tail (the message and the reply's opening) on a context that
    holds both histories, sample one token, then remove the tail (every switch sees the same context)."""

    def __init__(self, histories: dict[str, list[dict]], n_ctx: int, threads: int) -> None:
        self.rt = Runtime(Settings(n_ctx=n_ctx, slots=2, n_threads=threads,
                                   home=tempfile.mkdtemp(prefix="evoke-floor-")))
        rt = self.rt
        self.template = ChatTemplate(rt.meta("tokenizer.chat_template"), bos_token=rt.token_text("bos"),
                                     eos_token=rt.token_text("eos"))
        self.histories, self.seqs, self.ends = histories, {}, {}
        for seq, (name, history) in enumerate(histories.items()):
            tokens = rt.tokenize(self.template.render(history))
            rt.decode(tokens, seq, 0, logits_last=False)
            self.seqs[name], self.ends[name] = seq, len(tokens)

    def ask(self, name: str, message: str) -> float:
        history, rt = self.histories[name], self.rt
        user = {"role": "user", "content": message}
        tail = self.template.segment(history, user) + self.template.assistant_frame([*history, user]).opening
        start = time.perf_counter()
        rt.decode(rt.tokenize(tail), self.seqs[name], self.ends[name])
        int(np.argmax(rt.logits()))
        elapsed = time.perf_counter() - start
        ll.llama_memory_seq_rm(rt.memory(rt.context_of(self.seqs[name])), self.seqs[name], self.ends[name], -1)
        return elapsed

    def close(self) -> None:
        self.rt.close()


class ServerSystem:
    """llama-server serving each request as a client would: the whole history every time."""

    def __init__(self, binary: str, args: list[str], histories, n_ctx: int, threads: int, slots: bool) -> None:
        self.server = LlamaServer(binary, n_ctx=n_ctx, threads=threads, args=args).__enter__()
        self.histories, self.slots = histories, slots
        self.slot_of = {name: k for k, name in enumerate(histories)}

    def ask(self, name: str, message: str) -> float:
        return self.server.ttft([*self.histories[name], {"role": "user", "content": message}],
                                slot=self.slot_of[name] if self.slots else None)

    def close(self) -> None:
        self.server.__exit__(None, None, None)


class LlamaCppPythonSystem:
    """llama-cpp-python's `Llama` with `LlamaRAMCache` (its prompt cache in host RAM), or with none."""

    def __init__(self, histories, n_ctx: int, threads: int, n_batch: int, ram_cache: bool) -> None:
        from llama_cpp import LlamaRAMCache

        self.llm = comparator_llama(n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=n_batch)
        if ram_cache:
            self.llm.set_cache(LlamaRAMCache(capacity_bytes=8 << 30))
        self.histories = histories

    def ask(self, name: str, message: str) -> float:
        messages = [*self.histories[name], {"role": "user", "content": message}]
        start, first = time.perf_counter(), None
        for chunk in self.llm.create_chat_completion(messages=messages, max_tokens=2, temperature=0, stream=True):
            if first is None and chunk["choices"][0]["delta"].get("content"):
                first = time.perf_counter()
        return (first or time.perf_counter()) - start      # drained: llama-cpp-python caches at the end

    def close(self) -> None:
        self.llm.close()


def _closing(stack: contextlib.ExitStack, system):
    stack.callback(system.close)
    return system


def run(tokens: int | None = None, trials: int = 7, server: str | None = None, threads: int = 0,
        reprefill: bool = True, rpc: str | None = None) -> dict:
    """`rpc`: add evoke_rpc rows, the model split evenly across this machine and RPC workers (`auto`: two
    started on 127.0.0.1 for the run), taking turns with the others."""
    tokens = tokens or 2000
    threads = threads or os.cpu_count() or 1
    resident_budget, evicting_budget = 2 * tokens + 1024, tokens + 1024
    n_ctx = 4 * resident_budget
    docs = {"A": document("alpha", tokens), "B": document("beta", tokens)}
    order = (["A", "B"] * trials)[:trials]
    questions = [SHORT[i % len(SHORT)] + ("" if i < len(SHORT) else f" ({i + 1})") for i in range(trials)]
    with contextlib.ExitStack() as stack:
        endpoint_sets = stack.enter_context(bench_workers(rpc, sets=2))      # stopped last, after every system
        evoke = _closing(stack, IsolatedSystem(EvokeSystem, docs, resident_budget, threads))
        histories = evoke.call("histories")
        systems = {"evoke": evoke,
                   "evoke_evicting": _closing(stack, IsolatedSystem(EvokeSystem, docs, evicting_budget, threads)),
                   "evoke_evicting_typed_ahead": _closing(stack, IsolatedSystem(
                       EvokeSystem, docs, evicting_budget, threads, "", True)),
                   "floor": _closing(stack, IsolatedSystem(FloorSystem, histories, n_ctx, threads))}
        for label, budget, endpoints in zip(("evoke_rpc", "evoke_rpc_evicting"), (resident_budget, evicting_budget),
                                            endpoint_sets, strict=False):   # a given endpoint list: evoke_rpc only
            systems[label] = _closing(stack, IsolatedSystem(EvokeSystem, docs, budget, threads, endpoints))
        if server:
            n_server = 2 * n_ctx                        # llama-server splits -c between its slots
            two_slots = ["-np", "2", "--cache-ram", "0"]
            for label, args, ctx, slots in (("llama_server_2_slots", two_slots, n_server, True),
                                            ("llama_server_2_slots_fa_off", [*two_slots, "-fa", "off"], n_server, True),
                                            ("llama_server_defaults", [], n_server, False),
                                            ("llama_server_1_slot_cache_ram", ["-np", "1"], n_ctx, False)):
                systems[label] = _closing(stack, ServerSystem(server, args, histories, ctx, threads, slots))
        n_batch = Settings().n_batch
        systems["llama_cpp_python_ram_cache"] = _closing(stack, IsolatedSystem(
            LlamaCppPythonSystem, histories, n_ctx, threads, n_batch, ram_cache=True))
        if reprefill:
            systems["llama_cpp_python_reprefill"] = _closing(stack, IsolatedSystem(
                LlamaCppPythonSystem, histories, n_ctx, threads, n_batch, ram_cache=False))
        layout = evoke.call("layout")
        sizes = {"evoke": evoke.call("sizes"), "evoke_evicting": systems["evoke_evicting"].call("sizes")}
        for system in systems.values():                 # warm: each conversation served once, untimed
            for name, message in zip(("A", "B"), WARM, strict=True):
                system.ask(name, message)
        times: dict[str, list[float]] = {label: [] for label in systems}
        labels = list(systems)
        for i, (name, message) in enumerate(zip(order, questions, strict=True)):
            for label in labels[i % len(labels):] + labels[:i % len(labels)]:
                time.sleep(PAUSE_S)
                times[label].append(systems[label].ask(name, message))
        phases = {label: system.call("first_token_phases", len(WARM)) for label, system in systems.items()
                  if label.startswith("evoke")}
    medians = {k: statistics.median(v) for k, v in times.items()}
    floor = medians["floor"]
    servers = {k: v for k, v in medians.items() if k.startswith("llama_server")}
    best_label = min(servers, key=servers.get) if servers else None
    best_server = servers[best_label] if servers else None
    paired = ([e / b for e, b in zip(times["evoke"], times[best_label], strict=True)] if servers else [])
    return {"bench": "switch", "conversation_tokens": sizes,
            "budgets": {"evoke": resident_budget, "evoke_evicting": evicting_budget},
            "switches": trials, "threads": threads, "interleaved": True, "pause_s": PAUSE_S,
            "process_per_system": True,
            "evoke_layout": layout,
            "server": server or "not given: llama-server rows skipped",
            "rows": {k: {"median_ttft_s": round(v, 4), "vs_floor": round(v / floor, 2),
                         "ttft_s": [round(x, 4) for x in times[k]],
                         **({"first_token_phases_ms": phases[k]} if k in phases else {})}
                     for k, v in medians.items()},
            "evoke_vs_floor": round(medians["evoke"] / floor, 2),
            "evoke_vs_best_llama_server": round(medians["evoke"] / best_server, 2) if servers else None,
            "best_llama_server": best_label,
            "evoke_over_best_llama_server_same_switch": {   # the two timed at the same switch, seconds apart
                "median": round(statistics.median(paired), 2) if paired else None,
                "evoke_faster_in": f"{sum(r < 1 for r in paired)} of {len(paired)}" if paired else None},
            "evoke_evicting_vs_best_llama_server": (round(medians["evoke_evicting"] / best_server, 2)
                                                    if servers else None),
            "speedup_vs_reprefill": (round(medians["llama_cpp_python_reprefill"] / medians["evoke"], 1)
                                     if reprefill else None),
            "rpc": ({"workers": rpc, "endpoints": endpoint_sets,
                     "evoke_rpc_over_evoke": round(medians["evoke_rpc"] / medians["evoke"], 2),
                     "evoke_rpc_evicting_over_evoke_evicting": (round(medians["evoke_rpc_evicting"]
                                                                      / medians["evoke_evicting"], 2)
                                                                if "evoke_rpc_evicting" in medians else None)}
                    if endpoint_sets else None)}
