"""`bench rerank`: the model as a second-stage retriever. Of what a wide recovery brought back at a probe turn,
which block does the model rank first, against the memory manager's own signal, alone and fused by rank?

Invariants: the candidates are the blocks `bench retrieval`'s model-free replay brought back at each probe turn
whose fact block was among them, in the signal's order; the model reads each candidate alone in the runtime's
scratch sequence (its own tokens decoded from position 0: a splice in the engine would carry K/V computed in the
conversation's context) and then the question, scored by query likelihood (log p of the question's tokens: Sachan
et al., "UPR") and by its gain over the question alone (the positive per-token gains summed); fusion is reciprocal
rank (`recall_signals.RRF_K`). A rank is the fact block's among the turn's recoveries; nothing here changes them.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import time

import numpy as np

from evoke_engine.kvcache.blocks import Block
from evoke_engine.memory import recall_signals
from evoke_engine.memory.embedder import Embedder
from evoke_engine.runtime.kv import KVCache
from evoke_engine.runtime.runtime import Runtime
from evoke_engine.settings import Settings

from .recall_suite import SYSTEM, wilson
from .retrieval import FAMILIES, replay, sessions
from .retrieval_sim import SimConversation, VocabRuntime

log = logging.getLogger(__name__)
ORDERS = ("signal", "likelihood", "gain", "signal+likelihood", "signal+gain")


@dataclasses.dataclass
class ProbeCandidates:
    family: str
    question: list[int]
    candidates: list[Block]          # what the turn brought back, in the signal's order
    fact_blocks: list[str]


def collect(families: tuple[str, ...], seeds: range, settings: Settings) -> list[ProbeCandidates]:
    """Replay each family's sessions model-free; keep the probe turns whose fact block came back."""
    rt = VocabRuntime(None)
    embedder = Embedder(settings.embedder)
    embedder.warm()
    found: list[ProbeCandidates] = []
    for family in families:
        def observe(conv: SimConversation, out: dict, probe: dict, family: str = family) -> None:
            names = [name for name, _ in out["recovered"]]
            if not set(names) & set(probe["fact_blocks"]):
                return
            score = {d["block"]: d.get("score", 0.0) for d in conv.memory.decisions if d["turn"] == out["turn"]}
            by_name = {b.name: b for b in conv.memory.table.blocks}
            question = [b for b in conv.input_blocks(out["turn"]) if b.role == "user"][-1]
            ordered = sorted(names, key=lambda n: score.get(n, 0.0), reverse=True)
            found.append(ProbeCandidates(family, list(question.tokens),
                                         [by_name[n] for n in ordered], list(probe["fact_blocks"])))
        for session in sessions(family, seeds):
            replay(session, settings, rt, embedder, observe=observe)
    recall_signals.clear_cache(embedder)
    return found


class QuestionScorer:
    """Log-probabilities of a question's tokens after a candidate, in the runtime's scratch sequence."""

    def __init__(self, rt: Runtime) -> None:
        self.rt, self.kv, self.scratch = rt, KVCache(rt), rt.scratch_seq

    def token_logprobs(self, context: list[int], question: list[int]) -> np.ndarray:
        question = question[:self.rt.settings.n_batch]
        self.kv.drop(self.scratch)
        if context:
            self.rt.decode(context, self.scratch, 0, logits_last=False)
        self.rt.decode(question, self.scratch, len(context), logits_last=False, logits_all=True)
        rows = np.stack([self.rt.logits(i) for i in range(len(question) - 1)]).astype(np.float64)
        self.kv.drop(self.scratch)
        top = rows.max(axis=1)
        log_norm = top + np.log(np.exp(rows - top[:, None]).sum(axis=1))        # each row's log-sum-exp
        return rows[np.arange(len(rows)), question[1:]] - log_norm


def orders(probe: ProbeCandidates, scorer: QuestionScorer, cap: int) -> tuple[dict[str, list[str]], float]:
    """The candidates' names in each order of `ORDERS`, and the seconds the model took."""
    started = time.perf_counter()
    alone = scorer.token_logprobs([], probe.question)
    likelihood, gain = {}, {}
    for block in probe.candidates:
        lp = scorer.token_logprobs(block.tokens[-cap:], probe.question)
        likelihood[block.name] = float(lp.sum())
        gain[block.name] = float(np.clip(lp - alone, 0.0, None).sum())
    seconds = time.perf_counter() - started
    signal = [b.name for b in probe.candidates]

    def by(values: dict[str, float]) -> list[str]:
        return sorted(values, key=values.__getitem__, reverse=True)

    def fused(other: list[str]) -> list[str]:
        rrf = {n: 1 / (recall_signals.RRF_K + 1 + signal.index(n)) + 1 / (recall_signals.RRF_K + 1 + other.index(n))
               for n in signal}
        return by(rrf)
    return {"signal": signal, "likelihood": by(likelihood), "gain": by(gain),
            "signal+likelihood": fused(by(likelihood)), "signal+gain": fused(by(gain))}, seconds


def _top(rows: list[int], k: int) -> dict:
    hits = sum(r < k for r in rows)
    return {"k": hits, "n": len(rows), "rate": round(hits / len(rows), 3) if rows else None,
            "wilson95": wilson(hits, len(rows))}


def run(families: tuple[str, ...] = FAMILIES, seeds: int = 16, seed_start: int = 100, budget: int = 512,
        overrides: dict | None = None, max_context: int = 1024) -> dict:
    overrides = dict(overrides or {})
    settings = Settings(home=tempfile.mkdtemp(prefix="evoke-rerank-"), recovery="kv_restore", system_prompt=SYSTEM,
                        tools_enabled=False, budget_tokens=budget, **overrides)
    started = time.perf_counter()
    probes = collect(families, range(seed_start, seed_start + seeds), settings)
    log.info("%d probe turns brought their fact block back (%.0f s)", len(probes), time.perf_counter() - started)
    rt = Runtime(dataclasses.replace(settings, n_ctx=max(2048, 2 * max_context), slots=1))
    scorer = QuestionScorer(rt)
    rows = []
    try:
        for probe in probes:
            ordered, seconds = orders(probe, scorer, max_context)
            rows.append({"family": probe.family, "reads": len(probe.candidates) + 1, "seconds": seconds,
                         "rank": {name: min(order.index(n) for n in probe.fact_blocks if n in order)
                                  for name, order in ordered.items()}})
    finally:
        rt.close()
    return {"bench": "rerank", "model": rt.model_path.name, "families": list(families),
            "seeds": [seed_start, seed_start + seeds], "budget": budget, "overrides": overrides,
            **summarize(rows), "seconds": round(time.perf_counter() - started, 1)}


def summarize(rows: list[dict]) -> dict:
    """Top-1/2/3 rates of the fact block per order, per family at top 1, and the model's time."""
    def ranks(name: str, family: str | None = None) -> list[int]:
        return [r["rank"][name] for r in rows if family in (None, r["family"])]

    def pct(values: list[float], q: float) -> float | None:
        return round(float(np.percentile(values, q)), 1) if values else None

    per_read = [1000 * r["seconds"] / r["reads"] for r in rows]
    per_turn = [1000 * r["seconds"] for r in rows]
    families = dict.fromkeys(r["family"] for r in rows)
    return {"probe_turns": len(rows),
            "candidates_per_turn": round(float(np.mean([r["reads"] - 1 for r in rows])), 2) if rows else 0.0,
            "fact_block_rank": {name: {f"top{k}": _top(ranks(name), k) for k in (1, 2, 3)} for name in ORDERS},
            "per_family_top1": {family: {"n": len(ranks("signal", family)),
                                         **{name: _top(ranks(name, family), 1)["k"] for name in ORDERS}}
                                for family in families},
            "model_ms": {"per_read_p50": pct(per_read, 50), "per_turn_p50": pct(per_turn, 50),
                         "per_turn_p95": pct(per_turn, 95)}}
