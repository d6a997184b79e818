"""`bench retrieval` (= `bench recall --suite --no-model`): is the block holding the asked-for fact in the context
when the question is answered, measured on the memory manager alone (no model, no sampling).

Invariants: every configuration replays the same generated sessions (the modules of `WORKLOADS`; `suite`:
`recall_workload`) through `retrieval_sim.SimConversation`; a fact is in context only when every block that holds
part of its line is resident when the reply would start; replies are canned text of realistic length, a probe's
reply a reader's (`reader`: the value when the fact is in context); the line-vector cache is cleared per session, so
deciding costs are a session's own; recovery precision is over what probe turns brought back, kept precision over
what of it was still resident at those turns' ends (the turn end keeps what the reply used).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import random
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np

from evoke_engine.memory import recall_signals
from evoke_engine.memory.embedder import Embedder
from evoke_engine.settings import Settings

from .recall_suite import SYSTEM, wilson
from .recall_workload import Session
from .retrieval_sim import SimConversation, VocabRuntime

log = logging.getLogger(__name__)
FAMILIES = ("suite", "heldout", "day", "ops", "app", "platform")
WORKLOADS = {"heldout": "retrieval_workload", "day": "day_workload", "ops": "ops_workload",     # family -> module
             "app": "app_workload", "platform": "platform_workload"}

CANNED = {
    "attach": ["OK, I have read the files.", "OK. I read them; ask me anything about them."],
    "chat_fact": ["Noted.", "Noted, thanks."],
    "short": ["Cold is usually given as the opposite. Let me know if you want more examples or a longer answer.",
              "A banana is the usual example. Lemons are yellow too, and so are some kinds of pepper and squash.",
              "Spring follows it in most places, though the exact dates depend on the hemisphere you live in.",
              "The usual answer is eight. Insects have six; that is one easy way to tell the two groups apart."],
    "code": ["Here is one way to do it:\n\n```python\ndef solve(items):\n    result = []\n    for item in items:\n"
             "        if item is None:\n            continue\n        result.append(item)\n    return result\n```\n\n"
             "It walks the input once, skips empty entries and keeps the order. The cost is linear in the number of "
             "items and it uses one extra list. If you need it in place, swap elements instead of appending, and "
             "add a test with an empty input, a single item and a long list to be sure the edge cases hold.",
             "Sure:\n\n```javascript\nfunction helper(fn, wait) {\n  let timer = null;\n  return (...args) => {\n"
             "    clearTimeout(timer);\n    timer = setTimeout(() => fn(...args), wait);\n  };\n}\n```\n\n"
             "Each call resets the timer, so the wrapped function runs once the calls stop for the given wait. "
             "Keep the returned function around; creating a new one per event defeats the purpose."],
    "log": ["Nothing looks critical. There are a few retries and a slow query or two, which are worth watching if "
            "they grow, and one socket closed by a peer, which is usually a client going away. The heartbeats "
            "are regular and the worker restarted cleanly."],
    "probe": ["I am not sure; it should be in what you shared earlier.", "Let me look back at what you sent."],
}


def canned_reply(kind: str, rng: random.Random) -> str:
    return rng.choice(CANNED.get(kind, CANNED["short"]))


def reader(fact_blocks: list[str], value: str, unsure: str):
    """A probe's reply as a reader that can use its context writes it: the fact's value when every block holding
    the fact is resident as the reply starts, else `unsure` (the 135M model cannot read paraphrases; this is the
    reader the measure presumes). What the turn end keeps of a wide recovery is judged by this reply's words."""
    def reply(resident: set[str]) -> str:
        return f"It is {value}." if fact_blocks and all(name in resident for name in fact_blocks) else unsure
    return reply


def sessions(family: str, seeds: range, *, probes: int = 3, decoys: int = 2) -> list[Session]:
    if family == "suite":
        from .recall_workload import make_session

        return [make_session(seed, probes=probes, decoys=decoys) for seed in seeds]
    if family not in WORKLOADS:
        raise ValueError(f"unknown workload family {family!r}; valid: {', '.join(FAMILIES)}")
    make = importlib.import_module(f".{WORKLOADS[family]}", __package__).make_session
    return [make(seed, probes=probes) for seed in seeds]


def replay(session: Session, settings: Settings, rt: VocabRuntime, embedder: Embedder,
           observe: Callable[[SimConversation, dict, dict], None] | None = None,
           after_turn: Callable[[SimConversation], None] | None = None) -> dict:
    """One session through the memory manager; one row per probe, plus the session's costs and blocks.
    `observe(conversation, turn_out, probe_row)` sees each probe turn as it ends (`bench rerank`); `after_turn(
    conversation)` runs after every turn, as the engine's idle-time work would (`bench day --glosses write:`)."""
    recall_signals.clear_cache(embedder)
    conv = SimConversation(settings, rt, embedder, SYSTEM)
    rng = random.Random(session.seed * 31 + 7)
    fact_blocks: dict[int, list[str]] = {}
    probes = []
    try:
        for turn in session.turns:
            reply = getattr(turn, "reply", "") or canned_reply(turn.kind, rng)
            if turn.fact is not None:
                reply = reader(fact_blocks.get(id(turn.fact), []), turn.fact.value, reply)
            out = conv.send(turn.text, turn.attachments, reply, turn.max_tokens)
            if after_turn is not None:
                after_turn(conv)
            written = reply if isinstance(reply, str) else ""          # a table the assistant wrote holds facts too
            stated = turn.text + "".join(body for _, body in turn.attachments) + written
            for fact in session.facts:
                if id(fact) not in fact_blocks and fact.statement.strip() in stated:
                    fact_blocks[id(fact)] = conv.fact_blocks(out["turn"], fact.statement)
            if turn.fact is None:
                continue
            own = fact_blocks.get(id(turn.fact), [])
            recovered = out["recovered"]
            probes.append({"type": turn.fact.kind, "where": "chat" if turn.fact.where == "chat" else "file",
                           "question": turn.fact.question, "fact_blocks": own,
                           "in_context": bool(own) and all(name in out["resident"] for name in own),
                           "through_reply": bool(own) and all(name in out["through_reply"] for name in own),
                           "recovered": recovered, "recovered_tokens": sum(n for _, n in recovered),
                           "recovered_fact_tokens": sum(n for name, n in recovered if name in own),
                           "kept_tokens": sum(n for _, n in out["kept"]),
                           "kept_fact_tokens": sum(n for name, n in out["kept"] if name in own),
                           "decide_ms": round(out["decide_ms"], 3)})
            if observe is not None:
                observe(conv, out, probes[-1])
        blocks = [b for b in conv.memory.table.blocks if not b.shared]
        return {"seed": session.seed, "probes": probes, "decide_ms": conv.decide_ms, "turn_end_ms": conv.turn_end_ms,
                "recovered_per_turn": conv.recovered_per_turn,
                "over_budget_at_reply_start": max(a - settings.budget_tokens for a in conv.active_at_reply_start),
                "over_budget_at_turn_end": max(a - settings.budget_tokens for a in conv.active_at_turn_end),
                "block_tokens": {role: [b.n_tokens for b in blocks if b.role == role] for role in ("file", "user",
                                                                                              "assistant")},
                "facts_cut": sum(len(v) > 1 for v in fact_blocks.values()), "facts": len(fact_blocks),
                "conversation_tokens": sum(b.n_tokens for b in conv.memory.table.blocks),
                "decisions": list(conv.memory.decisions)}
    finally:
        conv.close()


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


def summarize(runs: list[dict], types: tuple[str, ...]) -> dict:
    probes = [p for r in runs for p in r["probes"]]

    def rate(rows: list[dict]) -> dict:
        k = sum(p["in_context"] for p in rows)
        return {"in_context": k, "n": len(rows), "rate": round(k / len(rows), 3) if rows else None,
                "wilson95": wilson(k, len(rows))}

    recovered = sum(p["recovered_tokens"] for p in probes)
    on_fact = sum(p["recovered_fact_tokens"] for p in probes)
    kept = sum(p.get("kept_tokens", 0) for p in probes)
    kept_on_fact = sum(p.get("kept_fact_tokens", 0) for p in probes)
    per_turn = [n for r in runs for n in r["recovered_per_turn"]]
    decide = [x for r in runs for x in r["decide_ms"]]
    turn_end = [x for r in runs for x in r["turn_end_ms"]]
    sizes = {role: [n for r in runs for n in r["block_tokens"][role]] for role in ("file", "user", "assistant")}
    return {"fact_block_in_context": rate(probes),
            "per_type": {kind: rate([p for p in probes if p["type"] == kind]) for kind in types},
            "by_location": {w: rate([p for p in probes if p["where"] == w]) for w in ("file", "chat")},
            "recovery_precision": round(on_fact / recovered, 3) if recovered else None,
            "recovered_tokens_at_probes": recovered,
            # of the recovered tokens still resident at the probe turn's end (a wide recovery evicts the rest)
            "kept_precision": round(kept_on_fact / kept, 3) if kept else None,
            "kept_tokens_at_probes": kept,
            "max_over_budget_at_reply_start": max((r.get("over_budget_at_reply_start", 0) for r in runs), default=0),
            "max_over_budget_at_turn_end": max((r.get("over_budget_at_turn_end", 0) for r in runs), default=0),
            "tokens_recovered_per_turn": round(statistics.mean(per_turn), 1) if per_turn else 0.0,
            "decide_ms": {"p50": _pct(decide, 50), "p95": _pct(decide, 95)},
            "turn_end_embedding_ms": {"p50": _pct(turn_end, 50), "p95": _pct(turn_end, 95)},
            "block_tokens": {role: {"n": len(v), "min": min(v, default=0), "p10": _pct(v, 10), "p50": _pct(v, 50),
                                    "p90": _pct(v, 90), "max": max(v, default=0)} for role, v in sizes.items()},
            "facts_cut_between_blocks": sum(r["facts_cut"] for r in runs),
            "facts": sum(r["facts"] for r in runs),
            "conversation_tokens_p50": _pct([r["conversation_tokens"] for r in runs], 50)}


def run(families: tuple[str, ...] = FAMILIES, seeds: int = 16, seed_start: int = 100,
        budgets: tuple[int, ...] = (256, 512, 1024), backends: tuple[str, ...] = ("kv_restore",),
        overrides: dict | None = None, probes: int = 3, decoys: int = 2, keep_sessions: bool = False) -> dict:
    overrides = dict(overrides or {})
    home = tempfile.mkdtemp(prefix="evoke-retrieval-")
    base = Settings(home=home, recovery="kv_restore", system_prompt=SYSTEM, tools_enabled=False, **overrides)
    rt = VocabRuntime(None)
    embedder = Embedder(base.embedder)
    embedder.warm()
    result: dict = {"bench": "retrieval", "model": "none (the memory manager over kv_sim, the GGUF's vocabulary)",
                    "families": list(families), "seeds": [seed_start, seed_start + seeds], "probes_per_session": probes,
                    "decoys": decoys, "budgets": list(budgets), "overrides": overrides, "results": {}, "raw": {}}
    started = time.perf_counter()
    for family in families:
        replays = sessions(family, range(seed_start, seed_start + seeds), probes=probes, decoys=decoys)
        types = tuple(dict.fromkeys(f.kind for s in replays for f in s.facts))
        for backend in backends:
            for budget in ((max(budgets),) if backend == "none" else budgets):
                settings = dataclasses.replace(base, budget_tokens=budget, recovery=backend)
                runs = [replay(s, settings, rt, embedder) for s in replays]
                summary = summarize(runs, types)
                key = f"{family}/{backend}@{budget}"
                result["results"][key] = summary
                if keep_sessions:
                    result["raw"][key] = runs
                log.info("%s: in context %s/%s, precision %s, decide p50 %s ms (%.0f s)", key,
                         summary["fact_block_in_context"]["in_context"], summary["fact_block_in_context"]["n"],
                         summary["recovery_precision"], summary["decide_ms"]["p50"], time.perf_counter() - started)
    result["bars"] = bars(result)
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def bars(result: dict) -> dict:
    """The issue's bars on the printed numbers (reported, never enforced)."""
    out = {}
    for key, row in result["results"].items():
        if "/kv_restore@" not in key:
            continue
        budget = int(key.rsplit("@", 1)[1])
        pooled = row["fact_block_in_context"]["rate"] or 0.0
        worst = min((v["rate"] for v in row["per_type"].values() if v["rate"] is not None), default=None)
        out[key] = {"pooled": pooled, "pooled_ok": pooled >= (0.80 if budget <= 256 else 0.90),
                    "worst_type": worst, "worst_type_ge_0.75": worst is not None and worst >= 0.75,
                    "precision_ge_0.5": (row["recovery_precision"] or 0.0) >= 0.5,
                    "kept_precision_ge_0.5": (row["kept_precision"] or 0.0) >= 0.5,      # what a wide turn kept
                    "decide_p50_le_30ms": (row["decide_ms"]["p50"] or 0.0) <= 30.0}
    return out
