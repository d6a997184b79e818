"""`bench long`: one coding session driven to 32K tokens (or `--tokens`) through every system side by side, a row
per turn and system (first token, decode speed, context, memory), with the issue's bars computed on the numbers.

Invariants: every system serves the same generated session (`long_workload`) in its own process (llama-server is
one), the systems take turns at every turn (rotating who goes first, a pause before each request), so a drift of
the machine lands on all alike; a system that fails a turn stops there (its row says why) and the others go on;
bars are reported, never enforced; the flatness windows are fixed by turn index and kind, never by the results,
and the reference window ends before the last five turns begin at every length (`window_turns`; the JSON names the
turns of both).
"""

from __future__ import annotations

import contextlib
import csv
import logging
import os
import statistics
import time

from evoke_engine.settings import Settings

from .conversations import PAUSE_S
from .isolated import IsolatedSystem
from .long_systems import EvokeLong, LlamaCppPythonLong, ServerLong
from .long_workload import COMPARABLE, LongSession, make_long_session

log = logging.getLogger(__name__)

MIB = 1 << 20
REFERENCE_TURN = 20             # the "turn 20"
SMALL_RAM_MIB = 64
NON_POOL_ALLOWANCE = 96 * MIB   # RSS growth besides the pool a run may show: texts, vectors, SQLite, allocator
EVOKE_SYSTEMS = {"evoke_2048": {"budget": 2048}, "evoke_4096": {"budget": 4096},
                 "evoke_2048_ram64m": {"budget": 2048, "small_ram": True},
                 "evoke_4096_ram64m": {"budget": 4096, "small_ram": True},
                 "evoke_2048_pool8": {"budget": 2048, "pool_bits": 8},
                 "evoke_2048_q8_0": {"budget": 2048, "kv_cache_type": "q8_0"}}
SERVER_SYSTEMS = ("llama_server_full", "llama_server_shift")
ALL_SYSTEMS = (*EVOKE_SYSTEMS, *SERVER_SYSTEMS, "llama_cpp_python_full")
# About 30 minutes of a quiet 2-core CPU at 32K tokens; llama_cpp_python_full (a second full-context prefill, about
# as long as the llama-server one) is run by naming it (docs/benchmarks.md gives both commands).
DEFAULT_SYSTEMS = ("evoke_2048", "evoke_4096", "evoke_2048_ram64m", "llama_server_full", "llama_server_shift")
CSV_FIELDS = ("system", "turn", "kind", "message_tokens_estimate", "reply_tokens_asked", "conversation_tokens",
              "ttft_s", "decode_tok_s", "reply_tokens", "prefill_tokens", "decoded_tokens", "active_tokens",
              "pool_ram_bytes", "spill_bytes", "rss_bytes", "rss_anon_bytes", "evictions", "recoveries",
              "recovered_from_disk", "dropped_tokens", "fact_in_context", "error")


def turn_payload(session: LongSession) -> list[dict]:
    """The turns as plain data for the system processes."""
    return [{"index": t.index, "kind": t.kind, "text": t.text, "attachments": [list(a) for a in t.attachments],
             "reply_tokens": t.reply_tokens, "planted": t.planted, "fact_value": t.fact.value if t.fact else None,
             "estimate": t.estimated_tokens} for t in session.turns]


def _full_context(session: LongSession) -> int:
    """A context holding the whole session with room to spare (the estimate is within a few percent)."""
    return -(-int(session.estimated_tokens * 1.2 + 2048) // 1024) * 1024


def _context_length_override(n_ctx: int, model: dict | None) -> list[str]:
    """llama-server caps a slot's context at the model's training context: past it, the whole-conversation
    server is told a longer one (positions past training are out of distribution for its replies, which this
    bench does not judge; its speed is what is measured)."""
    if not model or not model.get("architecture") or n_ctx <= model.get("n_ctx_train", n_ctx):
        return []
    return ["--override-kv", f"{model['architecture']}.context_length=int:{n_ctx}"]


def _start(label: str, session: LongSession, server: str | None, threads: int, ram_mib: int, flash: str,
           shift_ctx: int, model: dict | None = None):
    if label in EVOKE_SYSTEMS:
        spec = EVOKE_SYSTEMS[label]
        ram = ram_mib * MIB if spec.get("small_ram") else None
        return IsolatedSystem(EvokeLong, spec["budget"], threads, ram, spec.get("kv_cache_type", "f16"),
                              spec.get("pool_bits", 16))
    if label == "llama_cpp_python_full":
        return IsolatedSystem(LlamaCppPythonLong, _full_context(session), threads, Settings().n_batch)
    common = ["--cache-ram", "0", "-fa", flash]
    if label == "llama_server_full":
        n_ctx = _full_context(session)
        return ServerLong(server, n_ctx, threads, [*common, *_context_length_override(n_ctx, model)], window=False)
    return ServerLong(server, shift_ctx, threads, [*common, "--context-shift", "--cache-reuse", "256"], window=True)


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 4) if values else None


def window_turns(turns: list[int], size: int = 5) -> tuple[list[int], list[int]]:
    """(reference, end) windows over the usable `turns` (ascending): the end is the last `size`; the reference is
    the `size` turns nearest `REFERENCE_TURN` among those before the end window begins, so the two never share a
    turn at any length (a short run's reference is simply earlier; too short a run has none)."""
    end = turns[-size:]
    before = [t for t in turns if end and t < end[0]]
    reference = sorted(sorted(before, key=lambda t: (abs(t - REFERENCE_TURN), -t))[:size])
    return reference, end


def _windows(rows: list[dict], kinds: tuple[str, ...], key: str) -> dict:
    """Medians of `key` over the reference window and the last five of the turns of `kinds` that succeeded,
    with the turns of each (`window_turns`)."""
    usable = {r["turn"]: r for r in rows if r["kind"] in kinds and r.get(key) is not None and not r.get("error")}
    reference, end = window_turns(sorted(usable))
    return {"near_turn_20": _median(usable[t][key] for t in reference),
            "last_five": _median(usable[t][key] for t in end),
            "near_turn_20_turns": reference, "last_five_turns": end}


def summarize(label: str, rows: list[dict], described: dict, accounting: dict | None) -> dict:
    ok = [r for r in rows if not r.get("error")]
    ttft = _windows(rows, COMPARABLE, "ttft_s")
    decode_kinds = ("short", "code", "log", "trace", "probe")
    decode = _windows(rows, decode_kinds, "decode_tok_s")
    ttft_ref, ttft_end = ttft["near_turn_20"], ttft["last_five"]
    decode_ref, decode_end = decode["near_turn_20"], decode["last_five"]
    probes = [r for r in ok if r.get("fact_in_context") is not None]
    first = ok[0] if ok else {}
    last = ok[-1] if ok else {}
    out = {"config": described, "turns_done": len(ok), "stopped_at": next((r["turn"] for r in rows if r.get("error")),
                                                                          None),
           "error": next((r["error"] for r in rows if r.get("error")), None),
           "conversation_tokens": last.get("conversation_tokens"),
           "ttft_s": {**ttft, "end_over_turn_20": round(ttft_end / ttft_ref, 3) if ttft_ref and ttft_end else None},
           "decode_tok_s": {**decode, "turn_20_over_end": round(decode_ref / decode_end, 3)
                            if decode_ref and decode_end else None},
           "facts_in_context_at_probes": f"{sum(bool(r['fact_in_context']) for r in probes)}/{len(probes)}",
           "fact_rate": round(sum(bool(r["fact_in_context"]) for r in probes) / len(probes), 3) if probes else None,
           "rss_bytes": {"after_turn_1": first.get("rss_bytes"), "end": last.get("rss_bytes"),
                         "max": max((r.get("rss_bytes") or 0 for r in ok), default=None),
                         "anon_after_turn_1": first.get("rss_anon_bytes"), "anon_end": last.get("rss_anon_bytes")}}
    if described.get("kind") == "evoke" and ok:
        growth = (last.get("rss_anon_bytes") or 0) - (first.get("rss_anon_bytes") or 0)
        pool_growth = last["pool_ram_bytes"] - first["pool_ram_bytes"]
        out["memory"] = {**(accounting or {}), "rss_anon_growth_bytes": growth,
                         "pool_ram_growth_bytes": pool_growth, "non_pool_growth_bytes": growth - pool_growth,
                         "ram_budget_bytes": described["ram_budget_bytes"],
                         # RSS = model + llama.cpp contexts + pool + the rest (Python, torch and the embedder)
                         "model_bytes": described["model_bytes"],
                         "kv_context_bytes": described["n_ctx"] * described["raw_kv_bytes_per_token"],
                         "rss_rest_bytes": (last.get("rss_bytes") or 0) - described["model_bytes"]
                         - described["n_ctx"] * described["raw_kv_bytes_per_token"] - last["pool_ram_bytes"],
                         "growth_within_ram_budget": growth <= described["ram_budget_bytes"] + NON_POOL_ALLOWANCE,
                         "evictions": last["evictions"], "recoveries": last["recoveries"],
                         "dropped_tokens": last["dropped_tokens"]}
    return out


def bars(systems: dict[str, dict]) -> dict:
    """The issue's bars on the printed numbers (reported, never enforced)."""
    out: dict = {}
    full, shift = systems.get("llama_server_full"), systems.get("llama_server_shift")
    for label, s in systems.items():
        if s["config"].get("kind") != "evoke":
            continue
        ttft, decode, memory = s["ttft_s"], s["decode_tok_s"], s.get("memory", {})
        row = {"ttft_end_over_turn_20": ttft["end_over_turn_20"],
               "ttft_flat_le_1.25": _le(ttft["end_over_turn_20"], 1.25),
               "decode_turn_20_over_end": decode["turn_20_over_end"],
               "decode_flat_le_1.25": _le(decode["turn_20_over_end"], 1.25),
               "ram_bytes_per_evicted_token_over_raw": memory.get("ram_over_raw"),
               "ram_le_1.05_raw": _le(memory.get("ram_over_raw"), 1.05),
               "rss_growth_within_ram_budget": memory.get("growth_within_ram_budget"),
               "nothing_lost": memory.get("dropped_tokens") == 0 and not memory.get("drops"),
               "recovered_from_disk": memory.get("recovered_from_disk")}
        if full and full["ttft_s"]["last_five"] and ttft["last_five"]:
            row["ttft_llama_server_full_over_evoke_at_end"] = round(full["ttft_s"]["last_five"] / ttft["last_five"], 2)
        if full and full["decode_tok_s"]["last_five"] and decode["last_five"]:
            row["decode_evoke_over_llama_server_full_at_end"] = round(decode["last_five"]
                                                                      / full["decode_tok_s"]["last_five"], 2)
        if shift and shift["fact_rate"] is not None and s["fact_rate"] is not None:
            row["fact_rate_evoke_vs_context_shift"] = [s["fact_rate"], shift["fact_rate"]]
            row["facts_above_context_shift"] = s["fact_rate"] > shift["fact_rate"]
        out[label] = row
    return out


def _le(value, bound) -> bool | None:
    return None if value is None else value <= bound


def write_csv(path: str, result: dict) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for label, rows in result["rows"].items():
            for row in rows:
                writer.writerow({"system": label, **row})


def run(*, seed: int = 0, tokens: int | None = None, quick: bool = False, systems: tuple[str, ...] = DEFAULT_SYSTEMS,
        server: str | None = None, threads: int = 0, ram_mib: int = SMALL_RAM_MIB, shift_ctx: int = 4096) -> dict:
    target = tokens or (8192 if quick else 32768)
    session = make_long_session(seed, target)
    turns = turn_payload(session)
    threads = threads or os.cpu_count() or 1
    unknown = [s for s in systems if s not in ALL_SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; valid: {', '.join(ALL_SYSTEMS)}")
    skipped = [s for s in systems if s in SERVER_SYSTEMS and not server]
    systems = tuple(sorted((s for s in systems if s not in skipped), key=lambda s: s not in EVOKE_SYSTEMS))
    started = time.perf_counter()
    rows: dict[str, list[dict]] = {label: [] for label in systems}
    described: dict[str, dict] = {}
    accounting: dict[str, dict] = {}
    with contextlib.ExitStack() as stack:
        live = {}
        flash = "off"
        model: dict | None = None       # the model as an Evoke system describes it
        for label in systems:           # Evoke first: the servers take its resolved flash attention
            system = _start(label, session, server, threads, ram_mib, flash, shift_ctx, model)
            stack.callback(system.close)
            live[label] = system
            described[label] = system.describe() if isinstance(system, ServerLong) else system.call("describe")
            if label in EVOKE_SYSTEMS and EVOKE_SYSTEMS[label].get("kv_cache_type", "f16") == "f16":
                flash = described[label]["flash_attention"]
            if label in EVOKE_SYSTEMS:
                model = model or described[label]
        labels = list(live)
        for i, turn in enumerate(turns):
            for label in labels[i % len(labels):] + labels[:i % len(labels)]:
                if label not in live:
                    continue
                time.sleep(PAUSE_S)
                system = live[label]
                base = {"turn": i, "kind": turn["kind"], "message_tokens_estimate": turn["estimate"],
                        "reply_tokens_asked": turn["reply_tokens"]}
                try:
                    row = system.turn(turn) if isinstance(system, ServerLong) else system.call("turn", turn)
                except Exception as exc:            # noqa: BLE001 - the system stops; the run goes on
                    log.warning("%s failed at turn %d: %s", label, i, str(exc).splitlines()[-1:])
                    rows[label].append({**base, "error": str(exc)[-2000:]})
                    live.pop(label)
                    continue
                rows[label].append({**base, **row})
            log.info("turn %d/%d (%s) done in %.0f s", i + 1, len(turns), turn["kind"], time.perf_counter() - started)
        for label in labels:
            if label in EVOKE_SYSTEMS and label in live:
                accounting[label] = live[label].call("accounting")
    summaries = {label: summarize(label, rows[label], described[label], accounting.get(label)) for label in systems}
    result = {"bench": "long", "seed": seed, "target_tokens": target, "turns": len(turns),
              "workload": {"kinds": {k: sum(t["kind"] == k for t in turns) for k in dict.fromkeys(
                  t["kind"] for t in turns)}, "estimated_tokens": session.estimated_tokens,
                  "reply_tokens": sum(t["reply_tokens"] for t in turns),
                  "facts": [{"kind": f.kind, "where": f.where, "value": f.value} for f in session.facts],
                  "probe_turns": [t["index"] for t in turns if t["kind"] == "probe"]},
              "threads": threads, "pause_s": PAUSE_S, "small_ram_mib": ram_mib, "process_per_system": True,
              "server": server or "not given: llama-server rows skipped", "skipped": skipped,
              "systems": summaries, "bars": bars(summaries), "rows": rows,
              "seconds": round(time.perf_counter() - started, 1)}
    return result
