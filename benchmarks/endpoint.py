"""`bench endpoint`: a 14-turn coding-tool session (document at turn 1, probed at turn 14) sent through the
`openai` client to our endpoint and to llama-cpp-python's own server (`llama_cpp.server`), same model and
settings, same requests, one server at a time; per-request TTFT and latency, and the turn-14 TTFT ratio.

Invariants: both servers get byte-identical requests (the full history every turn, streamed, greedy);
ours also reports its `evoke` object per turn, so `decoded` can be checked against the new tail.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai

from evoke_engine.engine import Engine
from evoke_engine.runtime.runtime import default_model_path
from evoke_engine.settings import Settings

from .recall import FILLERS, PROBE, SYSTEM, make_document, passed

EXTRA_FILLERS = ["What is two plus three?", "Name a large ocean.", "What color is grass?",
                 "What do cows drink?", "Name a tool for cutting paper."]
TURNS = 14
ACK = "Please read this document and reply OK."
# llama_cpp.server on an AMX CPU needs the same guard as our runtime (llama.cpp's AMX repack crashes).
COMPARATOR = ("import sys, llama_cpp.llama_cpp as ll\n"
              "from evoke_engine.runtime.runtime import safe_model_params\n"
              "ll.llama_model_default_params = safe_model_params\n"
              "import llama_cpp.llama as lm\nlm.llama_cpp.llama_model_default_params = safe_model_params\n"
              "from llama_cpp.server.__main__ import main\nsys.argv = ['llama_cpp.server'] + sys.argv[1:]\nmain()\n")


def session_turns(seed: int) -> tuple[list[tuple[str, int]], str]:
    """(user text, max_tokens) for each of the 14 turns, and the passkey."""
    rng = random.Random(seed)
    document, passkey, _ = make_document(rng)
    fillers = rng.sample(FILLERS + EXTRA_FILLERS, TURNS - 2)
    first = f"[file document.txt]\n{document.rstrip()}\n[end of file document.txt]\n\n{ACK}"
    return [(first, 3)] + [(q, 48) for q in fillers] + [(PROBE, 16)], passkey


def run_session(client: openai.OpenAI, seed: int, session: str | None = None) -> dict:
    turns, passkey = session_turns(seed)
    history: list[dict] = [{"role": "system", "content": SYSTEM}]
    records = []
    headers = {"X-Evoke-Session": session} if session else {}
    for i, (text, max_tokens) in enumerate(turns, 1):
        history.append({"role": "user", "content": text})
        started = time.perf_counter()
        ttft, reply, usage, figures = None, "", None, None
        stream = client.chat.completions.create(model="evoke", messages=history, max_tokens=max_tokens,
                                                temperature=0, stream=True, stream_options={"include_usage": True},
                                                extra_headers=headers)
        for chunk in stream:
            if chunk.usage is not None:
                usage, figures = chunk.usage, (chunk.model_extra or {}).get("evoke")
            for choice in chunk.choices:
                if choice.delta.content:
                    ttft = ttft if ttft is not None else time.perf_counter() - started
                    reply += choice.delta.content
        total = time.perf_counter() - started
        history.append({"role": "assistant", "content": reply})
        extra = figures if usage is not None else None
        records.append({"turn": i, "ttft_s": ttft if ttft is not None else total, "latency_s": total,
                        "prompt_tokens": usage.prompt_tokens if usage else None, "evoke": extra, "reply": reply})
    return {"seed": seed, "passkey": passkey, "probe_passed": passed(records[-1]["reply"], passkey),
            "turns": records}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def our_client(settings: Settings):
    from evoke_engine.server import EndpointServer, ServerConfig

    engine = Engine(settings, scheduler=False)
    try:
        with EndpointServer(engine, ServerConfig(port=0), lifetime_s=3600) as server:
            yield engine, openai.OpenAI(base_url=server.address, api_key="bench", max_retries=0, timeout=600)
    finally:
        engine.close()


def check_tails(engine: Engine, result: dict, seed: int) -> None:
    """Record each turn's new-tail token count beside what the endpoint reported as decoded."""
    for record, (text, _) in zip(result["turns"], session_turns(seed)[0], strict=True):
        segment = engine.diagnostics().template.segment([{"role": "system", "content": SYSTEM}],
                                                        {"role": "user", "content": text})
        record["tail_tokens"] = len(engine.tokenize(segment))


@contextlib.contextmanager
def their_client(settings: Settings, model_path: Path):
    port = _free_port()
    threads = settings.n_threads or os.cpu_count() or 1
    cmd = [sys.executable, "-c", COMPARATOR, "--model", str(model_path), "--host", "127.0.0.1", "--port", str(port),
           "--n_ctx", str(settings.n_ctx), "--n_batch", str(settings.n_batch), "--n_ubatch", str(settings.n_batch),
           "--n_threads", str(threads), "--n_threads_batch", str(threads), "--model_alias", "evoke",
           "--verbose", "False"]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_ready(proc, log, port)
            yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="bench", max_retries=0, timeout=600)
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def _wait_ready(proc: subprocess.Popen, log, port: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"llama_cpp.server exited: {log.read()[-2000:].decode(errors='replace')}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("llama_cpp.server did not start within 120 s")


def _medians(results: list[dict], key: str) -> list[float]:
    return [statistics.median(r["turns"][t][key] for r in results) for t in range(TURNS)]


def run(seeds: int = 3, budget: int = 512, n_ctx: int = 8192, threads: int = 0, embedder: str = "") -> dict:
    """Both servers up at once; each seed's session goes to ours, then to theirs (noise hits both alike)."""
    home = tempfile.mkdtemp(prefix="evoke-bench-endpoint-")
    settings = Settings(home=home, budget_tokens=budget, n_ctx=n_ctx, n_threads=threads, temperature=0.0,
                        embedder=embedder)
    ours, theirs = [], []
    with our_client(settings) as (engine, client), their_client(settings, default_model_path()) as comparator:
        for seed in range(seeds):
            result = run_session(client, seed, session=f"bench-{seed}-{time.time_ns()}")
            check_tails(engine, result, seed)
            ours.append(result)
            theirs.append(run_session(comparator, seed))
    ours_ttft, theirs_ttft = _medians(ours, "ttft_s"), _medians(theirs, "ttft_s")
    tail_ok = all(r["turns"][t]["evoke"]["decoded"] == r["turns"][t]["tail_tokens"]
                  for r in ours for t in range(1, TURNS))
    return {
        "bench": "endpoint", "model": default_model_path().name, "budget_tokens": budget, "n_ctx": n_ctx,
        "n_threads": settings.n_threads or os.cpu_count(), "embedder": embedder or "all-MiniLM-L6-v2",
        "seeds": seeds, "turns": TURNS,
        "ours": {"median_ttft_s": ours_ttft, "median_latency_s": _medians(ours, "latency_s"),
                 "median_engine_ttft_s": [statistics.median(r["turns"][t]["evoke"]["engine_ttft_ms"] / 1000
                                                            for r in ours) for t in range(TURNS)],
                 "probe_passed": sum(r["probe_passed"] for r in ours),
                 "decoded_equals_tail_from_turn_2": tail_ok,
                 "evictions": [sum(t["evoke"]["evictions"] for t in r["turns"]) for r in ours],
                 "recoveries": [sum(t["evoke"]["recoveries"] for t in r["turns"]) for r in ours],
                 "decoded_per_turn": [[t["evoke"]["decoded"] for t in r["turns"]] for r in ours],
                 "tail_tokens_per_turn": [[t["tail_tokens"] for t in r["turns"]] for r in ours]},
        "llama_cpp_server": {"median_ttft_s": theirs_ttft, "median_latency_s": _medians(theirs, "latency_s"),
                             "probe_passed": sum(r["probe_passed"] for r in theirs)},
        "turn14_ttft_ratio": theirs_ttft[-1] / ours_ttft[-1] if ours_ttft[-1] > 0 else None,
    }


def table(r: dict) -> str:
    """The Markdown table of one run (used by `bench.report`)."""
    o, t = r["ours"], r["llama_cpp_server"]
    lines = ["| turn | ours TTFT s | of which engine s | llama_cpp.server TTFT s | ours latency s "
             "| llama_cpp.server latency s | decoded (ours, seed 0) |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for i in range(r["turns"]):
        lines.append(f"| {i + 1} | {o['median_ttft_s'][i]:.3f} | {o['median_engine_ttft_s'][i]:.3f} | "
                     f"{t['median_ttft_s'][i]:.3f} | {o['median_latency_s'][i]:.3f} | {t['median_latency_s'][i]:.3f} "
                     f"| {o['decoded_per_turn'][0][i]} |")
    lines += ["", f"Turn-14 median TTFT ratio (llama_cpp.server / ours): **{r['turn14_ttft_ratio']:.2f}**; "
                  f"probe passed: ours {o['probe_passed']}/{r['seeds']}, llama_cpp.server "
                  f"{t['probe_passed']}/{r['seeds']}; decoded == new tail from turn 2: "
                  f"{o['decoded_equals_tail_from_turn_2']}; evictions {o['evictions']}, recoveries {o['recoveries']} "
                  f"per session."]
    return "\n".join(lines)
