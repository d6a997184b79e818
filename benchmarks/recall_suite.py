"""`bench recall --suite`: the broad recall suite (six fact types, paraphrased probes) per backend and budget.

Invariants: every backend and budget replays the same generated sessions (`recall_workload`), greedy,
through the real Engine, one engine for the whole run (settings applied between configurations);
`none` is the ceiling and runs once (it never evicts, so the budget does not change it); a probe
passes only when its answer's whole tokens are in the reply; its fact is in context when every block holding
part of its line was resident as the reply started (`stats().reply_context`), as `bench retrieval` reads it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import tempfile
import time

from evoke_engine.engine import Engine
from evoke_engine.settings import Settings

from .recall_workload import FACT_TYPES, Session, make_session, overlap, passed

log = logging.getLogger(__name__)
SYSTEM = "You are a helpful assistant. Answer briefly."


def wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    """95% Wilson score interval of k successes in n trials."""
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 3), round(min(1.0, centre + half), 3)]


def _recovered_since(stats: dict, since: float) -> list[tuple[str, int]]:
    out = []
    for event in stats.get("events", []):
        if event["kind"] == "recovered" and event["time"] >= since and event.get("block"):
            out.append((event["block"].removeprefix("breadcrumb:"), event["tokens"]))
    return out


def _fact_blocks(blocks: list[dict], line: str) -> set[str]:
    """Input blocks (birth order, one message's blocks consecutive) holding any part of the fact's `line`:
    the fact is in context only when every one of them is resident."""
    line = line.strip()
    by_message: dict[int, list[dict]] = {}
    for block in blocks:
        if block["role"] in ("file", "user"):
            by_message.setdefault(block["turn"], []).append(block)
    for message in by_message.values():
        text, spans = "", []
        for block in message:
            spans.append((len(text), len(text) + len(block["text"]), block["name"]))
            text += block["text"]
        at = text.find(line)
        if at >= 0:
            return {name for start, stop, name in spans if start < at + len(line) and stop > at}
    return set()


def run_session(engine: Engine, session: Session) -> dict:
    conv = engine.new_conversation(system_prompt=SYSTEM, tools=[])
    turns, probes = [], []
    last_decided = 0
    for turn in session.turns:
        started_wall, started = time.time(), time.perf_counter()
        reply = conv.send(turn.text, attachments=turn.attachments, max_tokens=turn.max_tokens, temperature=0)
        seconds = time.perf_counter() - started
        stats = conv.stats().as_dict()
        decisions = [d for d in stats.get("recovery_decisions", []) if d["turn"] > last_decided]   # this turn's
        last_decided = max((d["turn"] for d in decisions), default=last_decided)
        recovered = _recovered_since(stats, started_wall)
        row = {"kind": turn.kind, "seconds": round(seconds, 3), "recovered": recovered}
        if turn.fact is not None:
            row["reply"] = reply.strip()[:120]
            row["passed"] = passed(reply, turn.fact)
            row["blocks"] = {b["name"]: b["state"] for b in stats["blocks"]}       # after the turn's end
            row["reply_context"] = set(stats["reply_context"])                       # as the reply started
            row["explained"] = [e["detail"] for e in stats.get("events", [])
                                if e["kind"] == "recovered" and e["time"] >= started_wall and e.get("detail")]
            row["decisions"] = decisions
            probes.append(row)
        turns.append(row)
    blocks = conv.blocks(with_text=True)
    stats = conv.stats().as_dict()
    engine.delete_conversation(conv.id)
    probed_blocks: set[str] = set()
    for fact in session.probed:
        probed_blocks |= _fact_blocks(blocks, fact.statement)
    for fact, row in zip(session.probed, probes, strict=True):
        own = _fact_blocks(blocks, fact.statement)
        row.update({"type": fact.kind, "where": "chat" if fact.where == "chat" else "file", "value": fact.value,
                    "question": fact.question, "overlap": round(overlap(fact), 2), "fact_blocks": sorted(own),
                    "fact_block_in_context": bool(own) and all(name in row["reply_context"] for name in own),
                    "fact_block_resident_after_turn": bool(own) and all(row["blocks"].get(name) == "resident"
                                                                        for name in own),
                    "recovered_tokens": sum(t for _, t in row["recovered"]),
                    "recovered_fact_tokens": sum(t for name, t in row["recovered"] if name in probed_blocks)})
        del row["blocks"], row["reply_context"]
    return {"seed": session.seed, "probes": probes, "turn_seconds": [t["seconds"] for t in turns],
            "recovered_tokens_per_turn": [sum(n for _, n in t["recovered"]) for t in turns],
            "evictions": stats["evictions"], "recoveries": stats["recoveries"],
            "max_active_at_turn_end": stats["max_active_at_turn_end"]}


def summarize(sessions: list[dict]) -> dict:
    probes = [p for s in sessions for p in s["probes"]]
    per_type = {}
    for kind in FACT_TYPES:
        rows = [p for p in probes if p["type"] == kind]
        k = sum(p["passed"] for p in rows)
        per_type[kind] = {"passed": k, "n": len(rows), "rate": round(k / len(rows), 3) if rows else None,
                          "wilson95": wilson(k, len(rows))}
    by_where = {}
    for where in ("file", "chat"):
        rows = [p for p in probes if p["where"] == where]
        k = sum(p["passed"] for p in rows)
        by_where[where] = {"passed": k, "n": len(rows), "rate": round(k / len(rows), 3) if rows else None}
    k = sum(p["passed"] for p in probes)
    recovered = sum(p["recovered_tokens"] for p in probes)
    on_fact = sum(p["recovered_fact_tokens"] for p in probes)
    per_turn = [n for s in sessions for n in s["recovered_tokens_per_turn"]]
    seconds = [x for s in sessions for x in s["turn_seconds"]]
    in_context = sum(p["fact_block_in_context"] for p in probes)
    return {"fact_block_in_context_at_probe": round(in_context / max(1, len(probes)), 3),
            "fact_block_in_context_wilson95": wilson(in_context, len(probes)),
            # after the turn's end: a wide recovery's overdraft and what the reply did not use have left by then
            "fact_block_resident_after_turn": round(sum(p.get("fact_block_resident_after_turn", False)
                                                        for p in probes) / max(1, len(probes)), 3),
            "fact_block_in_context_per_type": {
                kind: wilson(sum(p["fact_block_in_context"] for p in probes if p["type"] == kind),
                             sum(p["type"] == kind for p in probes)) for kind in FACT_TYPES},
            "recovery_precision": round(on_fact / recovered, 3) if recovered else None,
            "pooled": {"passed": k, "n": len(probes), "rate": round(k / len(probes), 3) if probes else None,
                       "wilson95": wilson(k, len(probes))},
            "per_type": per_type, "by_location": by_where,
            "recovered_tokens_at_probes": recovered,
            "tokens_recovered_per_turn": round(statistics.mean(per_turn), 1) if per_turn else 0.0,
            "evictions": sum(s["evictions"] for s in sessions), "recoveries": sum(s["recoveries"] for s in sessions),
            "max_active_at_turn_end": max((s["max_active_at_turn_end"] for s in sessions), default=0),
            "p50_turn_s": round(statistics.median(seconds), 3) if seconds else None,
            **({"attention_rerank": rerank} if (rerank := attention_rerank(probes)) else {})}


def attention_rerank(probes: list[dict]) -> dict | None:
    """The model as retriever, measured (needs `attention_capture`): at the probes where the fact's block was one of
    the turn's similarity recoveries, its rank among them by the signal's order (the decision's score), by the
    message's attention as the reply starts (`ConversationMemory.reply_starts`; per block and per token)
    and by the two orders fused (rank sum of the signal's and the per-token attention's).
    None when no decision carries the attention."""
    orders: dict[str, list[int]] = {"signal": [], "attention": [], "attention_per_token": [], "fused": []}
    keys = {"signal": "score", "attention": "message_attention", "attention_per_token": "message_attention_per_token"}
    candidates = []
    for probe in probes:
        similar = [d for d in probe.get("decisions", []) if d["reason"] == "similar"]
        own = set(probe.get("fact_blocks", ()))
        if not similar or not any(d["block"] in own for d in similar):
            continue
        if any(d.get("message_attention") is None for d in similar):
            continue
        candidates.append(len(similar))
        rank: dict[str, dict[str, int]] = {}
        for name, key in keys.items():
            ranked = sorted(similar, key=lambda d: -(d.get(key) or 0.0))
            rank[name] = {d["block"]: i + 1 for i, d in enumerate(ranked)}
        rank["fused"] = {b: 1 + sum(rank["signal"][c] + rank["attention_per_token"][c] <
                                    rank["signal"][b] + rank["attention_per_token"][b] for c in rank["signal"])
                         for b in rank["signal"]}        # the two orders' rank sum (ties share the better rank)
        for name in orders:
            orders[name].append(min(rank[name][b] for b in own if b in rank[name]))
    n = len(orders["signal"])
    if not n:
        return None
    return {"probes": n, "candidates_mean": round(statistics.mean(candidates), 1),
            **{name: {f"top{k}": sum(r <= k for r in ranks) for k in (1, 2, 3)} for name, ranks in orders.items()}}


def _ratios(summary: dict, ceiling: dict) -> dict:
    def ratio(a, b):
        return round(a / b, 3) if a is not None and b else None
    return {"pooled": ratio(summary["pooled"]["rate"], ceiling["pooled"]["rate"]),
            "per_type": {k: ratio(v["rate"], ceiling["per_type"][k]["rate"]) for k, v in summary["per_type"].items()}}


def bars(result: dict) -> dict:
    """The issue's bars, checked on the printed numbers (reported, never enforced)."""
    out = {}
    ceiling = result["ceiling"]
    for budget, row in result["policies"].get("kv_restore", {}).items():
        ratios = _ratios(row, ceiling) if ceiling else None
        if ratios:
            per_type = [r for r in ratios["per_type"].values() if r is not None]
            out[f"kv_restore@{budget}"] = {"pooled_over_ceiling": ratios["pooled"],
                                           "pooled_ge_0.95": ratios["pooled"] is not None and ratios["pooled"] >= 0.95,
                                           "worst_type_over_ceiling": min(per_type) if per_type else None,
                                           "every_type_ge_0.8": all(r >= 0.8 for r in per_type)}
    for budget, row in result["policies"].get("discard", {}).items():
        out[f"discard@{budget}"] = {"rate": row["pooled"]["rate"], "le_0.15": row["pooled"]["rate"] <= 0.15}
    return out


def run(seeds: int = 12, seed_start: int = 0, budgets: tuple[int, ...] = (256, 512, 1024),
        backends: tuple[str, ...] = ("none", "kv_restore", "breadcrumb", "discard"), probes: int = 3,
        overrides: dict | None = None, home: str | None = None, keep_sessions: bool = True, decoys: int = 2) -> dict:
    overrides = dict(overrides or {})
    sessions = [make_session(seed, probes=probes, decoys=decoys) for seed in range(seed_start, seed_start + seeds)]
    home = home or tempfile.mkdtemp(prefix="evoke-recall-suite-")
    base = Settings(home=home, n_ctx=8192, slots=2, budget_tokens=max(budgets), recovery="none",
                    system_prompt=SYSTEM, tools_enabled=False, **overrides)
    result: dict = {"bench": "recall_suite", "seeds": [seed_start, seed_start + seeds], "probes_per_session": probes,
                    "decoys": decoys,
                    "budgets": list(budgets), "overrides": overrides, "ceiling": None, "policies": {}, "raw": {}}
    started = time.perf_counter()
    with Engine(base, scheduler=False) as engine:
        engine.wait_idle()
        engine.diagnostics().embedder.warm()
        for backend in backends:
            for budget in ((max(budgets),) if backend == "none" else budgets):
                engine.apply_settings(dataclasses.replace(engine.settings, budget_tokens=budget, recovery=backend))
                runs = [run_session(engine, s) for s in sessions]
                summary = summarize(runs)
                log.info("%s@%s: %s/%s in %.0f s", backend, budget, summary["pooled"]["passed"],
                         summary["pooled"]["n"], time.perf_counter() - started)
                if backend == "none":
                    result["ceiling"] = summary
                else:
                    if result["ceiling"]:
                        summary["over_ceiling"] = _ratios(summary, result["ceiling"])
                    result["policies"].setdefault(backend, {})[str(budget)] = summary
                if keep_sessions:
                    result["raw"][f"{backend}@{budget}"] = runs
    result["bars"] = bars(result)
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def parse_overrides(items: list[str]) -> dict:
    """`key=value` pairs typed by the Settings field they name (a wrong key lists the valid ones)."""
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    out = {}
    for item in items:
        key, _, raw = item.partition("=")
        if key not in fields:
            raise SystemExit(f"unknown setting {key!r}; valid: {', '.join(sorted(fields))}")
        default = fields[key].default
        out[key] = type(default)(raw) if default is not None and not isinstance(default, bool) else \
            (raw.lower() in ("1", "true", "yes") if isinstance(default, bool) else raw)
    return out
