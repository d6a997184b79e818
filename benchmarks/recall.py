"""`bench recall`: the attached-document passkey workload under each recovery backend.

Invariant: every backend sees the same documents, filler questions and probe for a seed;
generation is greedy, so a run is reproducible on one machine.
"""

from __future__ import annotations

import random
import re
import time

from evoke_engine.engine import Engine
from evoke_engine.settings import Settings

from .recall_suite import wilson

TOPICS = ["the harbour", "the old mill", "the library", "the orchard", "the train station", "the bakery",
          "the market square", "the river bridge", "the school", "the hill farm", "the lighthouse",
          "the museum", "the forest path", "the town hall", "the workshop", "the garden"]
ACTIONS = ["repaired the roof", "painted the fence", "counted the boxes", "swept the floor",
           "watered the plants", "checked the lamps", "sorted the letters", "fed the horses",
           "cleaned the windows", "stacked the wood", "tested the bells", "mended the nets"]
FILLERS = ["What is a good name for a cat?", "Name a color of the sky at sunset.",
           "How many legs does a spider have?", "What do bees make?", "Give one word that rhymes with tree.",
           "What season comes after winter?", "What is the opposite of hot?", "Name a fruit that is yellow.",
           "What do you call a baby dog?", "Which planet do we live on?"]
SYSTEM = "You are a helpful assistant."
PROBE = "What is the passkey in the document? Answer with the number."


def make_document(rng: random.Random) -> tuple[str, str, int]:
    n = rng.randint(20, 40)
    paragraphs = []
    for i in range(n):
        who = rng.choice(["Anna", "Ben", "Carla", "David", "Eva", "Farid", "Grace", "Hugo"])
        paragraphs.append(f"On day {i + 1}, {who} went to {rng.choice(TOPICS)} and {rng.choice(ACTIONS)}. "
                          f"It was a {rng.choice(['quiet', 'busy', 'sunny', 'windy', 'rainy'])} day.")
    passkey = str(rng.randint(1000, 9999))
    depth = rng.randrange(n)
    paragraphs.insert(depth, f"The passkey is {passkey}. Remember the passkey {passkey}.")
    return "\n\n".join(paragraphs), passkey, depth


def passed(reply: str, passkey: str) -> bool:
    return passkey in re.findall(r"\d+", reply)


def run_one(engine: Engine, seed: int, *, fillers: int = 6) -> dict:
    rng = random.Random(seed)
    document, passkey, depth = make_document(rng)
    conv = engine.new_conversation(system_prompt=SYSTEM, tools=[])
    largest = 0
    # The acknowledgement is capped at 3 tokens so it cannot repeat the passkey: a reply that
    # quoted it would keep the digits resident in an assistant block and blur what recall measures.
    conv.send("Please read this document and reply OK.", attachments=[("document.txt", document)],
              max_tokens=3, temperature=0)
    largest = max(largest, conv.stats().active_tokens)
    for question in rng.sample(FILLERS, fillers):
        conv.send(question, max_tokens=80, temperature=0)
        largest = max(largest, conv.stats().active_tokens)
    key_blocks_before = [b for b in conv.stats().blocks if b["name"].startswith("file:")]
    reply = conv.send(PROBE, max_tokens=24, temperature=0)
    stats = conv.stats()
    largest = max(largest, stats.active_tokens)
    key_block = next((b for b in conv.blocks(with_text=True) if passkey in b["text"] and b["role"] == "file"), None)
    resident_at_probe = key_block is not None and key_block["state"] == "resident"
    engine.delete_conversation(conv.id)
    return {"seed": seed, "passed": passed(reply, passkey), "reply": reply.strip()[:80], "passkey": passkey,
            "depth": depth, "evictions": stats.evictions, "recoveries": stats.recoveries,
            "max_active_at_turn_end": max(largest, stats.max_active_at_turn_end),
            "key_block_resident_at_probe": resident_at_probe, "file_blocks": len(key_blocks_before)}


def run(seeds: int = 10, budget: int = 512, backends: tuple[str, ...] = ("none", "discard", "breadcrumb",
        "kv_restore"), home: str | None = None, overrides: dict | None = None,
        pool_bits: tuple[int, ...] = (), fillers: int = 6) -> dict:
    """`pool_bits`: every backend at each of these `pool_bits` (rows named backend@bits), else at the settings'.
    `fillers`: the filler questions between the document and the probe (at most `len(FILLERS)`)."""
    if not 0 <= fillers <= len(FILLERS):
        raise ValueError(f"fillers must be 0-{len(FILLERS)}, not {fillers}")
    results = {}
    arms = [(backend, bits) for backend in backends for bits in (pool_bits or (None,))]
    for backend, bits in arms:
        chosen = dict(overrides or {}) | ({} if bits is None else {"pool_bits": bits})
        settings = Settings(budget_tokens=budget, recovery=backend, n_ctx=8192, home=home, slots=2, **chosen)
        started = time.perf_counter()
        with Engine(settings) as engine:
            runs = [run_one(engine, seed, fillers=fillers) for seed in range(seeds)]
        passed_runs = sum(r["passed"] for r in runs)
        results[backend if bits is None else f"{backend}@{bits}"] = {
            "pass_rate": passed_runs / len(runs), "n": len(runs), "pool_bits": settings.pool_bits,
            "pass_rate_wilson95": [round(x, 3) for x in wilson(passed_runs, len(runs))],
            "evictions": sum(r["evictions"] for r in runs), "recoveries": sum(r["recoveries"] for r in runs),
            "runs_with_evictions_and_recoveries": sum(1 for r in runs if r["evictions"] and r["recoveries"]),
            "max_active_at_turn_end": max(r["max_active_at_turn_end"] for r in runs),
            "key_block_resident_at_probe": sum(r["key_block_resident_at_probe"] for r in runs),
            "seconds": round(time.perf_counter() - started, 1), "runs": runs}
    return {"bench": "recall", "budget_tokens": budget, "seeds": seeds, "fillers": fillers,
            "overrides": overrides or {},
            "backends": results}
