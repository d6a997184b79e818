"""`bench ablation`: which eviction signal keeps what the model needs: the embedder, the model's own
attention (mean over heads or Ada-KV), or both, on two workloads and several budgets.

Invariants: every arm and budget replays the same sessions (seeded, greedy) through the real Engine
with the `kv_restore` backend; arms differ only in the scorer's signals (recovery always ranks saved
blocks by embedding similarity, with last-known attention as its tie-breaker when captured); the
ceiling (no eviction) runs once per workload, since no budget changes it.
"""

from __future__ import annotations

import logging
import tempfile
import time

from evoke_engine.engine import Engine
from evoke_engine.settings import Settings

from . import recall as passkey
from . import two_facts
from .recall_suite import wilson

log = logging.getLogger(__name__)

_ATTENTION_ONLY = {"attention_capture": True, "weight_similarity": 0.0, "weight_focus": 0.0}
_BOTH = {"attention_capture": True}
ARMS: dict[str, dict] = {
    "embedding": {},
    "attention/mean": {**_ATTENTION_ONLY, "attention_aggregation": "mean"},
    "attention/adakv": {**_ATTENTION_ONLY, "attention_aggregation": "adakv"},
    "both/mean": {**_BOTH, "attention_aggregation": "mean"},
    "both/adakv": {**_BOTH, "attention_aggregation": "adakv"},
}
CEILING = {"recovery": "none"}
WORKLOADS = ("passkey", "two_facts")


def run_two_facts(engine: Engine, seed: int) -> dict:
    session = two_facts.make_session(seed)
    conv = engine.new_conversation(system_prompt=two_facts.SYSTEM, tools=[])
    for name, text in session.files:       # 3-token acknowledgements cannot quote a fact
        conv.send("Keep this file for later and reply OK.", attachments=[(name, text)], max_tokens=3, temperature=0)
    for question in session.fillers:
        conv.send(question, max_tokens=60, temperature=0)
    probes = []
    for fact in session.facts:
        reply = conv.send(fact.question, max_tokens=24, temperature=0)
        probes.append({"file": fact.file, "value": fact.value, "passed": two_facts.passed(reply, fact),
                       "reply": reply.strip()[:80]})
    stats = conv.stats()
    engine.delete_conversation(conv.id)
    return {"seed": seed, "probes": probes, "evictions": stats.evictions, "recoveries": stats.recoveries,
            "max_active_at_turn_end": stats.max_active_at_turn_end}


def run_passkey(engine: Engine, seed: int) -> dict:
    row = passkey.run_one(engine, seed)
    return {**row, "probes": [{"passed": row["passed"], "reply": row["reply"]}]}


RUNNERS = {"passkey": run_passkey, "two_facts": run_two_facts}


def _cell(arm: str, budget: int | None, workload: str, overrides: dict, seeds: range, home: str) -> dict:
    settings = Settings(home=home, budget_tokens=budget or 8192, n_ctx=8192, slots=2, **overrides)
    started = time.perf_counter()
    with Engine(settings) as engine:
        if settings.attention_capture and engine.diagnostics().attention is None:
            raise RuntimeError("attention capture unavailable (native/build.sh builds it)")
        sessions = [RUNNERS[workload](engine, seed) for seed in seeds]
    probes = [p for s in sessions for p in s["probes"]]
    k = sum(p["passed"] for p in probes)
    log.info("%s budget %s %s: %d/%d", arm, budget, workload, k, len(probes))
    return {"arm": arm, "budget": budget, "workload": workload, "passed": k, "n": len(probes),
            "rate": round(k / len(probes), 3), "wilson95": wilson(k, len(probes)),
            "evictions": sum(s["evictions"] for s in sessions), "recoveries": sum(s["recoveries"] for s in sessions),
            "max_active_at_turn_end": max(s["max_active_at_turn_end"] for s in sessions),
            "seconds": round(time.perf_counter() - started, 1),
            "failed_seeds": [s["seed"] for s in sessions if not all(p["passed"] for p in s["probes"])]}


def run(seeds: int = 12, budgets: tuple[int, ...] = (256, 512, 1024), workloads: tuple[str, ...] = WORKLOADS,
        arms: tuple[str, ...] = tuple(ARMS), ceiling: bool = True) -> dict:
    unknown = [a for a in arms if a not in ARMS] + [w for w in workloads if w not in RUNNERS]
    if unknown:
        raise ValueError(f"unknown arm or workload: {', '.join(unknown)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="evoke-ablation-") as home:
        for workload in workloads:
            if ceiling:
                rows.append(_cell("ceiling", None, workload, CEILING, range(seeds), home))
            for budget in budgets:
                for arm in arms:
                    rows.append(_cell(arm, budget, workload, ARMS[arm], range(seeds), home))
    return {"bench": "ablation", "seeds": seeds, "budgets": list(budgets), "workloads": list(workloads),
            "arms": {arm: ARMS[arm] for arm in arms}, "rows": rows}
