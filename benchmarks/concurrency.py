"""`bench concurrency`: several clients of one endpoint at once (issue 59), each system in its own process on the
same model file, one after another in one run: Evoke's `serve` (replies streamed together, `parallel_replies`:
`evoke` in the default slot layout, a KV stream per slot, where their tokens share each step's decode and each
attends over its own cells; `evoke_contexts` with a context a slot, where they take turns; `evoke_unified` with one
cache for all slots), Evoke with one reply at a time (`evoke_serial`,
`parallel_replies=1`, the engine before streams), and llama-server `-np N` with `--server`. Scenarios:
  behind   B sends a short question one second into A's long reply: B's first token against B alone, and A's
           longest token gap while B is admitted against A's median gap;
  clients  N clients (2, 4) send 64-token requests at once: aggregate tokens/s against one client alone, each
           first token, and whether every first token came before any reply ended;
  fim      a raw 16-token completion sent during a 200-token chat reply: its first token against alone;
  paste    a long prompt (7K tokens by default: llama-server caps a slot at SmolLM2's 8K training context) from
           one client while another streams: the streamer's longest gap and
           tokens/s against it streaming alone.

With `repeats` above 1 the short scenarios (behind, clients, fim) run that many times in a row on the same server
and each figure is their median (`samples` keeps every run's); the paste runs once (a minute a system).

Invariants: every request is streamed, greedy, and sent by its own thread over its own connection (of one client
built before any request is timed); times are the client's (from the request's send);
prompts differ per client (no shared prefix routes two clients to one conversation) and per run; servers bind to
127.0.0.1 and are always stopped.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

import httpx

from evoke_engine.settings import Settings

from .llama_server import LlamaServer

TOPICS = ["a lighthouse keeper", "a clockmaker", "a river pilot", "a beekeeper", "a mapmaker", "a glassblower",
          "a night baker", "a bridge engineer", "a tea merchant", "a stage magician", "a mountain guide",
          "a violin maker", "a ferry captain", "a stonemason", "a radio operator", "a cartoonist", "a shepherd",
          "a locksmith", "a tailor", "a weather watcher", "a falconer", "a bookbinder", "a canal keeper", "a puppeteer"]
COUNTRIES = ["France", "Spain", "Italy", "Norway", "Peru", "Kenya", "Chile", "Japan", "Egypt", "Canada"]
FUNCTIONS = [("fibonacci", "Return the n-th Fibonacci number."), ("factorial", "Return n factorial."),
             ("is_prime", "Return whether n is a prime number."), ("digit_sum", "Return the sum of n's digits."),
             ("collatz_steps", "Return how many Collatz steps take n to 1.")]
PASTE_LINE = "Line {i}: the service at port {port} restarts nightly, rotates its logs and reports to node {node}."


@dataclass
class Streamed:
    """One streamed request as its client saw it (seconds from the scenario's start)."""
    sent: float = 0.0
    stamps: list[float] = field(default_factory=list)     # each content chunk's arrival
    tokens: int = 0                                       # the server's completion_tokens (else chunks)
    error: str = ""

    @property
    def ttft(self) -> float:
        return self.stamps[0] - self.sent if self.stamps else float("nan")

    @property
    def end(self) -> float:
        return self.stamps[-1] if self.stamps else float("nan")

    def gaps(self, start: float = 0.0, stop: float = float("inf")) -> list[float]:
        return [b - a for a, b in zip(self.stamps, self.stamps[1:], strict=False) if start <= b and a <= stop]

    def rate(self) -> float:
        span = self.end - self.stamps[0] if len(self.stamps) > 1 else 0.0
        return (self.tokens - 1) / span if span > 0 else float("nan")


class Client:
    """Streams chat or raw completions from one server; `clock` is the scenario's zero. One `httpx.Client` for all
    requests, built once as an editor's or an agent's is: building one makes an SSL context even for http:// (25-30
    ms of CPU, which on two cores is taken from the server it times); each request opens a connection of its own
    (none kept alive: a server may close an idle one just as it is reused, and llama-server does)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.http = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=64, max_keepalive_connections=0))

    def close(self) -> None:
        self.http.close()

    def stream(self, path: str, body: dict, out: Streamed, clock: float) -> None:
        body = {**body, "stream": True, "temperature": 0, "stream_options": {"include_usage": True}}
        chunks = 0
        try:
            out.sent = time.perf_counter() - clock
            with self.http.stream("POST", self.base + path, json=body) as response:
                if response.status_code != 200:
                    out.error = f"{response.status_code}: {response.read()[:200]!r}"
                    return
                for line in response.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    choice = (event.get("choices") or [{}])[0]
                    text = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
                    if text:
                        out.stamps.append(time.perf_counter() - clock)
                        chunks += 1
                    if event.get("usage"):
                        out.tokens = int(event["usage"].get("completion_tokens") or 0)
        except httpx.HTTPError as exc:
            out.error = repr(exc)
        out.tokens = out.tokens or chunks

    def chat(self, text: str, max_tokens: int, out: Streamed, clock: float) -> None:
        self.stream("/v1/chat/completions", {"model": "evoke", "max_tokens": max_tokens,
                                             "messages": [{"role": "user", "content": text}]}, out, clock)

    def complete(self, prompt: str, max_tokens: int, out: Streamed, clock: float) -> None:
        self.stream("/v1/completions", {"model": "evoke", "max_tokens": max_tokens, "prompt": prompt}, out, clock)


def checked(*runs: Streamed) -> None:
    """Every request answered with tokens, else the bench stops and says which failed how."""
    failed = [r.error or "no tokens" for r in runs if r.error or not r.stamps]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(runs)} requests failed: {failed}")


def together(calls: list[tuple[float, object, tuple]]) -> None:
    """Run each (delay, fn, args) on its own thread, fn starting `delay` seconds after the first."""
    threads = []
    for delay, fn, args in calls:
        def run(delay=delay, fn=fn, args=args) -> None:
            time.sleep(delay)
            fn(*args)
        threads.append(threading.Thread(target=run, daemon=True))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def story(topic: str) -> str:
    return f"Write a long, detailed story about {topic}, with many events and names."


def paste_prompt(tokens: int) -> str:
    lines = [PASTE_LINE.format(i=i, port=8000 + i, node=i % 17) for i in range(tokens // 31)]   # ~31 tokens a line
    return "Here is a log:\n" + "\n".join(lines) + "\n\nWhich port does line 7 mention?"


def capital_question(run: int, which: int) -> str:
    return f"What is the capital of {COUNTRIES[(2 * run + which) % len(COUNTRIES)]}? One word."


def scenario_behind(client: Client, reply_tokens: int, run: int = 0) -> dict:
    alone_b = Streamed()
    client.chat(capital_question(run, 0), 16, alone_b, time.perf_counter())
    a, b = Streamed(), Streamed()
    clock = time.perf_counter()
    together([(0.0, client.chat, (story(TOPICS[run % len(TOPICS)]), reply_tokens, a, clock)),
              (1.0, client.chat, (capital_question(run, 1), 16, b, clock))])
    checked(alone_b, a, b)
    gaps_all = a.gaps()
    admitted = a.gaps(b.sent, b.stamps[0] if b.stamps else b.sent)
    median = statistics.median(gaps_all) if gaps_all else float("nan")
    return {"b_ttft_alone_s": round(alone_b.ttft, 3), "b_ttft_behind_a_s": round(b.ttft, 3),
            "b_ratio": round(b.ttft / alone_b.ttft, 2), "a_median_gap_s": round(median, 4),
            "a_longest_gap_while_b_admitted_s": round(max(admitted, default=0.0), 4),
            "a_gap_ratio": round(max(admitted, default=0.0) / median, 2) if median else None,
            "a_ended_before_b_first_token": a.end < b.stamps[0]}


def scenario_clients(client: Client, counts: tuple[int, ...], max_tokens: int, run: int = 0) -> dict:
    topics = TOPICS[run * (1 + sum(counts)) % len(TOPICS):] + TOPICS     # this run's own, then again from the top
    alone = Streamed()
    clock = time.perf_counter()
    client.chat(story(topics[0]), max_tokens, alone, clock)
    checked(alone)
    single_rate = alone.tokens / (alone.end - alone.sent)
    out = {"one_client_tokens_per_s": round(single_rate, 1), "one_client_ttft_s": round(alone.ttft, 3)}
    used = 1
    for n in counts:
        runs = [Streamed() for _ in range(n)]
        clock = time.perf_counter()
        together([(0.0, client.chat, (story(topics[used + i]) + f" ({n} at once)", max_tokens, runs[i], clock))
                  for i in range(n)])
        used += n
        checked(*runs)
        span = max(r.end for r in runs) - min(r.sent for r in runs)
        aggregate = sum(r.tokens for r in runs) / span
        out[f"n{n}"] = {"aggregate_tokens_per_s": round(aggregate, 1),
                        "aggregate_vs_one": round(aggregate / single_rate, 2),
                        "first_tokens_s": [round(r.ttft, 3) for r in runs],
                        "ends_s": [round(r.end, 3) for r in runs],
                        "every_first_before_any_end": max(r.stamps[0] for r in runs) < min(r.end for r in runs),
                        "tokens": [r.tokens for r in runs]}
    return out


def scenario_fim(client: Client, reply_tokens: int, run: int = 0) -> dict:
    name, doc = FUNCTIONS[run % len(FUNCTIONS)]
    prompt = f'def {name}(n):\n    """{doc}"""\n'
    alone = Streamed()
    client.complete(prompt, 16, alone, time.perf_counter())
    chat, fim = Streamed(), Streamed()
    clock = time.perf_counter()
    together([(0.0, client.chat, (story(TOPICS[(run + 2) % len(TOPICS)]), reply_tokens, chat, clock)),
              (1.0, client.complete, (prompt + "    # iterative\n", 16, fim, clock))])
    checked(alone, chat, fim)
    return {"completion_ttft_alone_s": round(alone.ttft, 3), "completion_ttft_during_chat_s": round(fim.ttft, 3),
            "ratio": round(fim.ttft / alone.ttft, 2)}


def scenario_paste(client: Client, paste_tokens: int, reply_tokens: int) -> dict:
    alone = Streamed()
    client.chat(story(TOPICS[3]), reply_tokens, alone, time.perf_counter())
    streamer, paste = Streamed(), Streamed()
    clock = time.perf_counter()
    together([(0.0, client.chat, (story(TOPICS[4]), reply_tokens, streamer, clock)),
              (1.0, client.chat, (paste_prompt(paste_tokens), 8, paste, clock))])
    checked(alone, streamer, paste)
    during = streamer.gaps(paste.sent, paste.stamps[0] if paste.stamps else streamer.end)
    return {"streamer_tokens_per_s_alone": round(alone.rate(), 1),
            "streamer_tokens_per_s_with_paste": round(streamer.rate(), 1),
            "rate_ratio": round(streamer.rate() / alone.rate(), 2),
            "streamer_longest_gap_during_paste_s": round(max(during, default=0.0), 3),
            "paste_ttft_s": round(paste.ttft, 3)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EvokeServer:
    """`python -m evoke_engine serve` in a fresh home with `overrides` saved as its settings; stopped on exit."""

    def __init__(self, overrides: dict, n_ctx: int) -> None:
        self.home = tempfile.mkdtemp(prefix="bench-concurrency-")
        Settings(home=self.home, n_ctx=n_ctx, embedder="off", **overrides).save()
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> EvokeServer:
        env = {**os.environ, "EVOKE_HOME": self.home}
        self.proc = subprocess.Popen([sys.executable, "-m", "evoke_engine", "serve", "--port", str(self.port)], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.3)
        self.__exit__()
        raise RuntimeError("the Evoke endpoint did not start in 180 s")

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None


def median_of(samples: list) -> object:
    """One figure from a scenario's runs: numbers by their median, flags true only if true in every run, dicts key by
    key; anything else (a list of times) as the runs gave it."""
    first = samples[0]
    if isinstance(first, bool):
        return all(samples)
    if isinstance(first, (int, float)) and not any(s is None for s in samples):
        return round(statistics.median(samples), 4)
    if isinstance(first, dict):
        return {key: median_of([s[key] for s in samples]) for key in first}
    return samples


def repeated(scenario, repeats: int) -> dict:
    """`scenario(run)` for run 0..repeats-1: each run asks its own prompts, so no run's first token comes from a
    cache of the same text an earlier run sent (llama-server keeps each slot's last prompt)."""
    samples = [scenario(run) for run in range(repeats)]
    return samples[0] if repeats == 1 else {**median_of(samples), "samples": samples}


def run_system(base: str, *, reply_tokens: int, counts: tuple[int, ...], paste_tokens: int, repeats: int = 1) -> dict:
    client = Client(base)
    try:
        warm = Streamed()
        client.chat("Say hi.", 4, warm, time.perf_counter())                 # first-request costs out of the way
        return {"behind": repeated(lambda run: scenario_behind(client, reply_tokens, run), repeats),
                "clients": repeated(lambda run: scenario_clients(client, counts, 64, run), repeats),
                "fim": repeated(lambda run: scenario_fim(client, reply_tokens, run), repeats),
                "paste": scenario_paste(client, paste_tokens, reply_tokens)}
    finally:
        client.close()


def measured(system: str, measure) -> dict | str:
    """One system's figures, or why it could not be measured (the other systems' figures stand)."""
    try:
        return measure()
    except (RuntimeError, OSError, httpx.HTTPError) as exc:
        return f"failed: {exc}"


def run(*, server: str | None, threads: int, reply_tokens: int = 200, counts: tuple[int, ...] = (2, 4),
        paste_tokens: int = 7000, repeats: int = 1,
        systems: tuple[str, ...] = ("evoke", "evoke_contexts", "evoke_serial", "llama_server"),
        overrides: dict | None = None) -> dict:
    threads = threads or os.cpu_count() or 1
    slots = max(counts) + 1                     # a reply in each, and one slot for opening (parallel_replies)
    n_ctx = 16384 * slots                       # each slot's own stream or context holds the paste
    results: dict = {"reply_tokens": reply_tokens, "paste_tokens": paste_tokens, "threads": threads,
                     "repeats": repeats, "overrides": overrides or {}}
    figures = dict(reply_tokens=reply_tokens, counts=counts, paste_tokens=paste_tokens, repeats=repeats)
    common = {"n_threads": threads, "slots": slots, "budget_tokens": 12288, **(overrides or {})}

    def evoke(parallel: int, **shape) -> dict:
        with EvokeServer({**common, "parallel_replies": parallel, **shape}, n_ctx) as endpoint:
            return run_system(f"http://127.0.0.1:{endpoint.port}", **figures)

    def llama() -> dict:            # its slots are capped at the model's training context (8192 for SmolLM2)
        with LlamaServer(server, n_ctx=16384 * max(counts), threads=threads,
                         args=["-np", str(max(counts)), "--cont-batching"]) as endpoint:
            return run_system(f"http://127.0.0.1:{endpoint.port}", **figures)
    if "evoke" in systems:
        results["evoke"] = measured("evoke", lambda: evoke(max(counts)))
    for layout in ("contexts", "unified"):     # the default is streams
        name = f"evoke_{layout}"
        if name in systems:
            results[name] = measured(name, lambda shape=layout: evoke(max(counts), slot_layout=shape))
    if "evoke_serial" in systems:
        results["evoke_serial"] = measured("evoke_serial", lambda: evoke(1))
    if "llama_server" in systems and server:
        results["llama_server"] = measured("llama_server", llama)
    elif "llama_server" in systems:
        results["llama_server"] = "skipped: no --server binary (native/build_llama_server.sh)"
    return results

