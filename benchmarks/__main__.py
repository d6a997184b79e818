"""`python -m benchmarks <name> --json`: measurements that print JSON.

Invariant: each command prints one JSON object (with machine facts) on stdout and nothing else; a run
started while the load average exceeds the cores warns on stderr and says so in its machine facts (llama.cpp's
threads spin on a busy machine and every figure lies).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import sys


def machine() -> dict:
    return {"machine": platform.machine(), "processor": _cpu_name(), "cores": os.cpu_count(),
            "python": platform.python_version(), "date": datetime.date.today().isoformat(),
            "load_average": round(os.getloadavg()[0], 2)}


def llama_device() -> str | None:
    """The device llama.cpp computed on, for a bench that loaded a model (a GPU's figures are not a CPU's); None
    for a bench that never touched llama.cpp."""
    if "evoke_engine.runtime.runtime" not in sys.modules:
        return None
    from evoke_engine.runtime import device

    return device.detect().label()


def warn_if_busy() -> bool:
    """Warn (stderr) when the 1-minute load average exceeds the cores; True when it does."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > cores:
        print(f"WARNING: load average {load:.2f} exceeds the {cores} cores: llama.cpp's threads spin and every "
              "timing here lies; run on a quiet machine", file=sys.stderr)
        return True
    return False


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def _families(text: str) -> tuple[str, ...]:
    """The workload families named in `--families`, or every one (`retrieval.FAMILIES`, the one list of them)."""
    from .retrieval import FAMILIES

    return tuple(part for part in text.split(",") if part.strip()) or FAMILIES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    sub = parser.add_subparsers(dest="name", required=True)
    p = sub.add_parser("restore", help="save+restore against re-prefill")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--sizes", default="32,128,512,1024")
    p.add_argument("--model", default=None)
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--n-gpu-layers", type=int, default=-1)
    p.add_argument("--rpc", help="also split the model across RPC workers: auto (two on 127.0.0.1) or host:port,...")
    p.add_argument("--flash-attention", default="auto", choices=("auto", "on", "off"))
    p.add_argument("--pool-bits", default="", help="also the host pool at these bits (e.g. 16,8,4): RAM per saved "
                   "token, take+splice time, logit difference against the 16-bit restore (bench pool's rows)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a Settings override (repeatable), e.g. --set kv_direct=false for the serialised path alone")
    p = sub.add_parser("pool", help="host pool at 16, 8 and 4 bits: bytes, pack/unpack time, logits after a splice")
    p.add_argument("--bits", default="16,8,4")
    p.add_argument("--docs", type=int, default=6)
    p.add_argument("--trials", type=int, default=9)
    p.add_argument("--model", default=None)
    p.add_argument("--n-ctx", type=int, default=4096)
    p = sub.add_parser("recall", help="attached-document passkey recall per recovery backend")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--budget", type=int, default=512)
    p.add_argument("--backends", default=None, help="default: none,discard,breadcrumb,kv_restore "
                   "(with --suite: none,kv_restore,breadcrumb,discard)")
    p.add_argument("--suite", action="store_true", help="the broad recall suite (six fact types, paraphrases)")
    p.add_argument("--quick", action="store_true", help="with --suite: 2 seeds at budget 512 (a slow test)")
    p.add_argument("--seed-start", type=int, default=0, help="with --suite: first seed")
    p.add_argument("--budgets", default="256,512,1024", help="with --suite: comma-separated budgets")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a Settings override for every run (repeatable), e.g. --set recovery_top_k=2")
    p.add_argument("--decoys", type=int, default=2, help="with --suite: look-alike facts per fact (difficulty)")
    p.add_argument("--fillers", type=int, default=6, help="passkey recall: filler questions between the document "
                   "and the probe (at most 10; 10 makes the endpoint's fourteen-turn length)")
    p.add_argument("--pool-bits", default="", help="passkey recall: each backend at each of these pool_bits (e.g. "
                   "16,8,4), side by side")
    p.add_argument("--no-raw", action="store_true", help="with --suite: leave per-session rows out")
    p.add_argument("--no-model", action="store_true", help="with --suite: the model-free retrieval bench "
                   "(= bench retrieval)")
    p.add_argument("--families", default="", help="with --no-model: workload families (default: all)")
    p = sub.add_parser("retrieval", help="fact block in context at probe, model-free: the memory manager over a "
                                         "simulated KV cache, six workload families")
    p.add_argument("--families", default="", help="default: all of suite (the recall suite's sessions), "
                   "heldout, day (a working day, written after the defaults were fixed), ops (written before the fifth "
                   "pass's levers were tried on it), app (written in the sixth pass and run once on the defaults), "
                   "platform (written in the seventh pass to judge a lever, run once with and without it)")
    p.add_argument("--seeds", type=int, default=16)
    p.add_argument("--seed-start", type=int, default=100, help="seeds 0-15 of the suite are the dev split")
    p.add_argument("--budgets", default="256,512,1024")
    p.add_argument("--backends", default="kv_restore")
    p.add_argument("--decoys", type=int, default=2)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--raw", action="store_true", help="keep per-session rows (recovery decisions included)")
    p.add_argument("--identifier-words", choices=("on", "off"), default=None, help="issue 61: lines read with "
                   "identifiers as words and code abbreviations expanded (default: the engine's)")
    p = sub.add_parser("rerank", help="the model as a second-stage retriever: its rank of the fact block among a "
                                      "wide recovery's candidates, against the memory manager's signal")
    p.add_argument("--families", default="", help="default: all (as bench retrieval)")
    p.add_argument("--seeds", type=int, default=16)
    p.add_argument("--seed-start", type=int, default=100)
    p.add_argument("--budget", type=int, default=512)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p = sub.add_parser("endpoint", help="14-turn session: our endpoint against llama_cpp.server")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--budget", type=int, default=512)
    p.add_argument("--n-ctx", type=int, default=8192)
    p.add_argument("--threads", type=int, default=0, help="CPU threads for both servers (0 = all cores)")
    p.add_argument("--embedder", default="", help="our scorer's embedder ('off': identity and name recovery only)")
    p = sub.add_parser("paste", help="first token of a long paste under a small budget: decode, embedding and "
                                     "the rest, against no eviction")
    p.add_argument("--budgets", default="768")
    p.add_argument("--kb", type=float, default=7.0)
    p.add_argument("--trials", type=int, default=4)
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0 = automatic)")
    p = sub.add_parser("reuse", help="a second conversation attaching the same file: its blocks spliced from the "
                                     "first conversation (chunk index) against decoding them")
    p.add_argument("--file-tokens", type=int, default=2000)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--seeds", type=int, default=10, help="approximate rows: conversations with another first message")
    p.add_argument("--repairs", default="0,16", help="approximate rows: tokens recomputed after each seam")
    p.add_argument("--no-endpoint", action="store_true", help="skip the rows through the OpenAI endpoint")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0 = automatic)")
    p = sub.add_parser("edit", help="regenerate, edit 3 turns back and fork against re-prefill")
    p.add_argument("--tokens", type=int, default=None)
    p.add_argument("--trials", type=int, default=3)
    p = sub.add_parser("first_turns", help="first token of Continue in place against decoding the reply again, and "
                                           "of a first start while the embedder is exported")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--reply-tokens", type=int, default=300)
    p = sub.add_parser("overhead", help="the engine's time per turn outside llama.cpp calls (p50, p95) at 50 and "
                       "300 blocks, and its share of the first token (each reply's breakdown)")
    p.add_argument("--blocks", type=_ints, default=(50, 300), help="block counts, comma-separated")
    p.add_argument("--turns", type=int, default=20, help="timed turns per block count (after 2 warm-up turns)")
    p.add_argument("--max-tokens", type=int, default=8, help="reply length of each timed turn")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0 = all cores)")
    p.add_argument("--typed-ahead", action="store_true", help="a turn in each cycle has its message prepared "
                   "(Engine.prepare_ahead) during the pause before it (the window's settled draft), reported apart")
    p.add_argument("--embedded-ahead", action="store_true", help="a turn in each cycle has its message's vector "
                   "started just before Enter (the window's short typing pause), reported apart")
    p.add_argument("--history", type=int, default=0, help="short exchanges before the timed turns (a long "
                   "conversation's history)")
    p = sub.add_parser("day", help="issue 46: 30 facts over a 32K-token coding day, probed 2K-25K tokens later, "
                       "model-free (the memory manager over kv_sim): in context per form and distance")
    p.add_argument("--script", default="dev", choices=("dev", "held", "paraphrase", "reworded"),
                   help="held and paraphrase (issue 61: no word shared with the fact's line): the final check only; "
                   "reworded: the paraphrase forms in other lines, to tune on")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--seed-start", type=int, default=0)
    p.add_argument("--budgets", type=_ints, default=(2048, 4096))
    p.add_argument("--set", action="append", default=[], help="a setting override, name=value (repeatable)")
    p.add_argument("--identifier-words", choices=("on", "off"), default=None, help="issue 61: lines read with "
                   "identifiers as words and code abbreviations expanded (default: the engine's)")
    p.add_argument("--context-beside", choices=("on", "off"), default=None, help="issue 61: structured lines also "
                   "embedded spelled out with their file, parent keys or table, beside the line (default: the "
                   "engine's)")
    p.add_argument("--glosses", default=None, metavar="write:PATH|read:PATH", help="issue 61: the decisions read "
                   "the model's glosses of value lines: written by the real embedded model after each turn (saved "
                   "to PATH), or read from PATH")
    p.add_argument("--gloss-model", default=None, metavar="FILE", help="issue 61: with --glosses write:PATH, the "
                   "GGUF that writes them (default: the embedded model)")
    p.add_argument("--bare-declarations", choices=("on", "off"), default=None, help="issue 61: the words' reading "
                   "drops a declaration's syntax (export const, a SQL column's type) (default: the engine's)")
    p.add_argument("--question-query", choices=("on", "off"), default=None, help="issue 61: a message that asks "
                   "for a value is embedded as its question alone (default: the engine's)")
    p.add_argument("--gloss-alone", choices=("on", "off"), default=None, help="issue 61: a glossed line's vector "
                   "is made of its gloss alone, not the gloss and the line (default: the engine's)")
    p = sub.add_parser("decode", help="tokens/s of a greedy reply at 2K and 8K context: Evoke against "
                       "llama-cpp-python's Llama (and llama-server with --server), same threads and sampler")
    p.add_argument("--contexts", type=_ints, default=(2048, 8192), help="context lengths, comma-separated")
    p.add_argument("--tokens", type=int, default=256, help="reply length")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="CPU threads for every system (0 = all cores)")
    p.add_argument("--server", help="a llama-server binary; its rows are skipped without one")
    p = sub.add_parser("concurrency", help="several clients of one endpoint at once: a question behind a long "
                       "reply, N clients together, a raw completion during a chat, a long paste beside a stream; "
                       "Evoke's serve, Evoke one reply at a time, and llama-server -np N with --server")
    p.add_argument("--server", help="a llama-server binary; its rows are skipped without one")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for every system (0 = all cores)")
    p.add_argument("--reply-tokens", type=int, default=200, help="the long replies' max_tokens")
    p.add_argument("--clients", type=_ints, default=(2, 4), help="client counts, comma-separated")
    p.add_argument("--paste-tokens", type=int, default=7000, help="the long prompt's size in tokens (about; "
                   "llama-server caps a slot at the model's training context, 8192 for SmolLM2)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each short scenario (behind, clients, fim) on "
                   "one server: each figure is their median, every run's kept under `samples`")
    p.add_argument("--systems", default="evoke,evoke_contexts,evoke_serial,llama_server",
                   help="comma-separated: evoke (streams), evoke_contexts, evoke_unified, evoke_serial, llama_server")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting of both Evoke servers (repeatable), e.g. prefill_step_tokens=16")
    p = sub.add_parser("batch-invariance", help="a decoding token's logits alone against beside N prompt rows of "
                       "another sequence in one ubatch, bit for bit, in the unified and streams layouts (no timing)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0 = all cores)")
    p = sub.add_parser("batch-ceiling", help="issue 59: N prompts and replies at once against one, llama.cpp alone "
                       "(no server, no sampler): the zero-overhead bound on bench concurrency's clients ratio")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--prompt", type=int, default=31, help="prompt tokens each client prefills past the cached head")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0 = all cores)")
    p = sub.add_parser("gloss-idle", help="issue 61: the gloss writer as the engine runs it, on the real model: a "
                       "day session's turns with think time between; its cost per block, its share of the idle "
                       "time, and how long turns that arrived while it wrote waited")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--turns", type=int, default=14)
    p.add_argument("--think", type=float, default=6.0, help="seconds of idle time after each reply")
    p.add_argument("--budget", type=int, default=1024, help="the conversation's active-KV budget in tokens")
    p.add_argument("--model", default=None, help="a GGUF file (default: the embedded SmolLM2-135M)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0 = all cores)")
    p = sub.add_parser("attention", help="decode tokens/s with the attention capture on one layer against off")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--layers", default="", help="captured layers (empty: one at about 2/3 depth)")
    p.add_argument("--gqa", default="mean", choices=("mean", "max"))
    p.add_argument("--flash-attention", default="auto", choices=("auto", "on", "off"))
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0 = all cores; 1 gives clean CPU times)")
    p = sub.add_parser("ablation", help="eviction signals (embedding, attention mean/Ada-KV, both) on two workloads")
    p.add_argument("--seeds", type=int, default=12)
    p.add_argument("--budgets", default="256,512,1024")
    p.add_argument("--workloads", default="passkey,two_facts")
    p.add_argument("--arms", default="embedding,attention/mean,attention/adakv,both/mean,both/adakv")
    p.add_argument("--no-ceiling", action="store_true", help="skip the no-eviction ceiling row per workload")
    p = sub.add_parser("switch", help="alternate two long conversations: TTFT against the floor, llama-server "
                                      "and llama-cpp-python, in one run")
    p.add_argument("--tokens", type=int, default=None)
    p.add_argument("--trials", type=int, default=7)
    p.add_argument("--server", help="a llama-server binary (native/build_llama_server.sh); its rows are "
                                    "skipped without one")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for every system (0 = all cores)")
    p.add_argument("--no-reprefill", action="store_true", help="skip the slow llama-cpp-python re-prefill row")
    p.add_argument("--rpc", help="add Evoke rows with the model split across RPC workers: auto (two on 127.0.0.1) "
                                 "or host:port,...")
    p = sub.add_parser("long", help="one coding session to 32K tokens: first token, decode speed, RAM and disk per "
                                    "turn, Evoke against llama-server and llama-cpp-python side by side")
    p.add_argument("--quick", action="store_true", help="about 8K tokens (a slow test)")
    p.add_argument("--tokens", type=int, default=None, help="the session's target length (default 32768)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--systems", default=None, help="comma-separated (default: evoke_2048, evoke_4096, "
                   "evoke_2048_ram64m, llama_server_full, llama_server_shift; also llama_cpp_python_full, "
                   "evoke_4096_ram64m, evoke_2048_pool8, evoke_2048_q8_0)")
    p.add_argument("--server", help="a llama-server binary; its rows are skipped without one")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for every system (0 = all cores)")
    p.add_argument("--ram-mib", type=int, default=64, help="the small RAM budget of the *_ram64m systems")
    p.add_argument("--shift-ctx", type=int, default=4096, help="the context of llama_server_shift")
    p.add_argument("--csv", help="write one row per turn and system here")
    p.add_argument("--plots", help="write long-chat-{ttft,decode,rss}.png into this folder")
    for name in ("reopen", "prewarm"):
        p = sub.add_parser(name)
        p.add_argument("--tokens", type=int, default=None)
        p.add_argument("--trials", type=int, default=3)
        p.add_argument("--server", help="a llama-server binary: adds its row (skipped without one)")
    for p in sub.choices.values():
        p.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger("benchmarks").setLevel(logging.INFO)      # progress lines on stderr
    busy = warn_if_busy()

    if args.name == "restore":
        from .recall_suite import parse_overrides
        from .restore import run

        result = run(tuple(int(s) for s in args.sizes.split(",")), trials=args.trials, n_ctx=args.n_ctx,
                     model_path=args.model, n_gpu_layers=args.n_gpu_layers, rpc=args.rpc,
                     flash_attention=args.flash_attention, pool_bits=_ints(args.pool_bits),
                     overrides=parse_overrides(args.set))
    elif args.name == "pool":
        from .pool import run

        result = run(docs=args.docs, trials=args.trials, n_ctx=args.n_ctx, model_path=args.model,
                     bits=_ints(args.bits))
    elif args.name == "retrieval" or args.name == "recall" and args.suite and args.no_model:
        from .recall_suite import parse_overrides
        from .retrieval import run

        if getattr(args, "identifier_words", None) is not None:
            from evoke_engine.memory import recall_signals

            recall_signals.IDENTIFIER_WORDS = args.identifier_words == "on"
        result = run(families=_families(args.families), seeds=args.seeds,
                     seed_start=args.seed_start if args.name == "retrieval" else 100 + args.seed_start,
                     budgets=tuple(int(b) for b in args.budgets.split(",")),
                     backends=tuple((args.backends or "kv_restore").split(",")), overrides=parse_overrides(args.set),
                     decoys=args.decoys, keep_sessions=getattr(args, "raw", False))
    elif args.name == "rerank":
        from .recall_suite import parse_overrides
        from .rerank import run

        result = run(families=_families(args.families), seeds=args.seeds, seed_start=args.seed_start,
                     budget=args.budget, overrides=parse_overrides(args.set))
    elif args.name == "recall" and args.suite:
        from .recall_suite import parse_overrides, run

        backends = tuple((args.backends or "none,kv_restore,breadcrumb,discard").split(","))
        seeds, budgets = (2, (512,)) if args.quick else (args.seeds, tuple(int(b) for b in args.budgets.split(",")))
        result = run(seeds=seeds, seed_start=args.seed_start, budgets=budgets, backends=backends,
                     overrides=parse_overrides(args.set), keep_sessions=not args.no_raw, decoys=args.decoys)
    elif args.name == "recall":
        from .recall import run
        from .recall_suite import parse_overrides

        result = run(seeds=args.seeds, budget=args.budget, overrides=parse_overrides(args.set),
                     backends=tuple((args.backends or "none,discard,breadcrumb,kv_restore").split(",")),
                     pool_bits=_ints(args.pool_bits), fillers=args.fillers)
    elif args.name == "endpoint":
        from .endpoint import run

        result = run(seeds=args.seeds, budget=args.budget, n_ctx=args.n_ctx, threads=args.threads,
                     embedder=args.embedder)
    elif args.name == "day":
        from .recall_suite import parse_overrides
        from .workday import run

        result = run(script=args.script, seeds=args.seeds, seed_start=args.seed_start, budgets=args.budgets,
                     overrides=parse_overrides(args.set),
                     identifier_words=None if args.identifier_words is None else args.identifier_words == "on",
                     context_beside=None if args.context_beside is None else args.context_beside == "on",
                     glosses=args.glosses, gloss_model=args.gloss_model,
                     bare_declarations=None if args.bare_declarations is None else args.bare_declarations == "on",
                     question_query=None if args.question_query is None else args.question_query == "on",
                     gloss_alone=None if args.gloss_alone is None else args.gloss_alone == "on")
    elif args.name == "decode":
        from .decode import run

        result = run(contexts=args.contexts, tokens=args.tokens, rounds=args.rounds, threads=args.threads,
                     server=args.server)
    elif args.name == "concurrency":
        from .concurrency import run
        from .llama_server import check_binary
        from .recall_suite import parse_overrides

        result = run(server=check_binary(args.server), threads=args.threads, reply_tokens=args.reply_tokens,
                     counts=args.clients, paste_tokens=args.paste_tokens, repeats=args.repeats,
                     systems=tuple(args.systems.split(",")),
                     overrides=parse_overrides(args.set))
    elif args.name == "batch-invariance":
        from .batch_invariance import run

        result = run(threads=args.threads or os.cpu_count() or 1)
    elif args.name == "batch-ceiling":
        from .batch_ceiling import run

        result = run(threads=args.threads or os.cpu_count() or 1, clients=args.clients, prompt=args.prompt,
                     trials=args.trials)
    elif args.name == "gloss-idle":
        from .gloss_idle import run

        result = run(seed=args.seed, turns=args.turns, think_s=args.think, budget_tokens=args.budget,
                     model_path=args.model, threads=args.threads)
    elif args.name == "attention":
        from .attention import run

        result = run(context=args.context, tokens=args.tokens, rounds=args.rounds, layers=args.layers, gqa=args.gqa,
                     flash_attention=args.flash_attention, threads=args.threads)
    elif args.name == "ablation":
        from .ablation import run

        result = run(seeds=args.seeds, budgets=tuple(int(b) for b in args.budgets.split(",")),
                     workloads=tuple(args.workloads.split(",")), arms=tuple(args.arms.split(",")),
                     ceiling=not args.no_ceiling)
    elif args.name == "switch":
        from .llama_server import check_binary
        from .switch import run

        result = run(tokens=args.tokens, trials=args.trials, server=check_binary(args.server),
                     threads=args.threads, reprefill=not args.no_reprefill, rpc=args.rpc)
    elif args.name == "paste":
        from .paste import run

        result = run(budgets=tuple(int(b) for b in args.budgets.split(",")), kb=args.kb, trials=args.trials,
                     threads=args.threads)
    elif args.name == "reuse":
        from .reuse import run

        result = run(file_tokens=args.file_tokens, trials=args.trials, max_tokens=args.max_tokens,
                     threads=args.threads, seeds=args.seeds, repairs=tuple(int(r) for r in args.repairs.split(",")),
                     endpoint=not args.no_endpoint)
    elif args.name == "long":
        from .llama_server import check_binary
        from .long import DEFAULT_SYSTEMS, run

        systems = tuple(args.systems.split(",")) if args.systems else DEFAULT_SYSTEMS
        result = run(seed=args.seed, tokens=args.tokens, quick=args.quick, systems=systems,
                     server=check_binary(args.server), threads=args.threads, ram_mib=args.ram_mib,
                     shift_ctx=args.shift_ctx)
    elif args.name == "edit":
        from .edit import run

        result = run(tokens=args.tokens, trials=args.trials)
    elif args.name == "first_turns":
        from .first_turns import run

        result = run(trials=args.trials, reply_tokens=args.reply_tokens)
    elif args.name == "overhead":
        from .overhead import run

        result = run(blocks=args.blocks, turns=args.turns, threads=args.threads, max_tokens=args.max_tokens,
                     typed_ahead=args.typed_ahead, history=args.history, embedded_ahead=args.embedded_ahead)
    else:
        from . import conversations
        from .llama_server import check_binary

        result = getattr(conversations, f"run_{args.name}")(tokens=args.tokens, trials=args.trials,
                                                            server=check_binary(args.server))
    result["machine"] = {**machine(), "busy_at_start": busy, "llama_device": llama_device()}
    if args.name == "long":
        from .long import write_csv
        from .long_plots import plot

        if args.csv:
            write_csv(args.csv, result)
        if args.plots:
            result["plots"] = plot(result, args.plots)
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
