"""Markdown tables from the JSON the benches print (so docs/benchmarks.md copies figures, never retypes them).

Usage: python -m benchmarks.report restore.json recall.json switch.json reopen.json prewarm.json
"""

from __future__ import annotations

import json
import sys


def _machine(result: dict) -> str:
    m = result.get("machine", {})
    return (f"_{m.get('processor', '?')}, {m.get('cores', '?')} cores, Python {m.get('python', '?')}, "
            f"{m.get('date', '?')}_")


def restore(r: dict) -> str:
    lines = [f"`bench restore` on {r['model_desc']} ({r['device']}, n_ctx {r['n_ctx']}, {r['kv_cache_type']} KV, "
             f"median of {r['trials']}, native re-anchor: {r['native_reanchor']}). {_machine(r)}", "",
             "| tokens | KV bytes | save ms | restore ms | of which next-decode K-shift ms | re-prefill ms | speedup "
             "| restore via llama.cpp K-shift ms | speedup with it |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in r["rows"]:
        lines.append(f"| {row['tokens']} | {row['bytes']:,} | {row['save_ms']} | {row['restore_ms']} | "
                     f"{row['next_decode_extra_ms']} | {row['reprefill_ms']} | **{row['speedup']}x** | "
                     f"{row['llama_shift_restore_ms']} | {row['speedup_with_llama_shift']}x |")
    return "\n".join(lines)


def recall(r: dict) -> str:
    lines = [f"`bench recall --seeds {r['seeds']} --budget {r['budget_tokens']}`. {_machine(r)}", "",
             "| backend | pass rate | n | evictions | recoveries | runs with both | largest active at turn end "
             "| passkey block resident at probe | seconds |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, b in r["backends"].items():
        lines.append(f"| {name} | **{b['pass_rate']:.2f}** | {b['n']} | {b['evictions']} | {b['recoveries']} | "
                     f"{b['runs_with_evictions_and_recoveries']} | {b['max_active_at_turn_end']} | "
                     f"{b['key_block_resident_at_probe']}/{b['n']} | {b['seconds']} |")
    return "\n".join(lines)


def simple(r: dict) -> str:
    skip = {"machine"}
    rows = [f"| {k} | {json.dumps(v) if isinstance(v, (list, dict)) else v} |" for k, v in r.items() if k not in skip]
    return "\n".join([f"`bench {r['bench']}`. {_machine(r)}", "", "| field | value |", "|---|---|", *rows])


def edit(r: dict) -> str:
    lines = [f"`bench edit` on a {r['conversation_tokens']}-token conversation (median of {r['trials']}). "
             f"{_machine(r)}", "",
             "| operation | Evoke TTFT s | re-prefill TTFT s | speedup |", "|---|---:|---:|---:|"]
    for name in ("regenerate", "edit_3_back", "fork"):
        row = r[name]
        lines.append(f"| {name} | {row['evoke_median_s']} | {row['reprefill_median_s']} | **{row['speedup']}x** |")
    return "\n".join(lines)


def recall_suite(r: dict) -> str:
    """One row per (backend, budget): pooled and per-type pass rates with Wilson 95% intervals."""
    from .recall_workload import FACT_TYPES

    def cell(row: dict) -> str:
        return f"{row['passed']}/{row['n']} [{row['wilson95'][0]:.2f}, {row['wilson95'][1]:.2f}]"

    over = " ".join(f"--set {k}={v}" for k, v in r.get("overrides", {}).items())
    lines = [f"`bench recall --suite --seeds {r['seeds'][1] - r['seeds'][0]} --seed-start {r['seeds'][0]} "
             f"--budgets {','.join(map(str, r['budgets']))} --decoys {r.get('decoys', 2)}"
             f"{' ' + over if over else ''}`. {_machine(r)}", "",
             "| backend | budget | pooled | " + " | ".join(FACT_TYPES) + " | fact block in context at probe "
             "| recovery precision | tokens recovered / turn | p50 turn s |",
             "|---|---:|---:|" + "---:|" * len(FACT_TYPES) + "---:|---:|---:|---:|"]
    rows = ([("none", "-", r["ceiling"])] if r.get("ceiling") else []) + \
        [(name, budget, row) for name, by_budget in r["policies"].items() for budget, row in by_budget.items()]
    for name, budget, row in rows:
        lines.append(f"| {name} | {budget} | **{cell(row['pooled'])}** | "
                     + " | ".join(cell(row["per_type"][t]) for t in FACT_TYPES)
                     + f" | {row['fact_block_in_context_at_probe']} | {row['recovery_precision']} | "
                       f"{row['tokens_recovered_per_turn']} | {row['p50_turn_s']} |")
    return "\n".join(lines)


def retrieval(r: dict) -> str:
    """One row per (family, backend, budget): fact block in context at probe (Wilson 95%), per type, precision,
    tokens recovered per turn, deciding cost."""
    def cell(row: dict) -> str:
        return f"{row['in_context']}/{row['n']} [{row['wilson95'][0]:.2f}, {row['wilson95'][1]:.2f}]"

    over = " ".join(f"--set {k}={v}" for k, v in r.get("overrides", {}).items())
    lines = [f"`bench retrieval --families {','.join(r['families'])} --seeds {r['seeds'][1] - r['seeds'][0]} "
             f"--seed-start {r['seeds'][0]} --budgets {','.join(map(str, r['budgets']))}"
             f"{' ' + over if over else ''}`. {_machine(r)}", "",
             "| family | backend@budget | fact block in context | per type | precision | tokens recovered / turn "
             "| deciding ms p50 / p95 | facts cut |", "|---|---|---:|---|---:|---:|---:|---:|"]
    for key, row in r["results"].items():
        family, config = key.split("/", 1)
        types = ", ".join(f"{t} {v['in_context']}/{v['n']}" for t, v in row["per_type"].items())
        lines.append(f"| {family} | {config} | **{cell(row['fact_block_in_context'])}** | {types} | "
                     f"{row['recovery_precision']} | {row['tokens_recovered_per_turn']} | "
                     f"{row['decide_ms']['p50']} / {row['decide_ms']['p95']} | "
                     f"{row['facts_cut_between_blocks']}/{row['facts']} |")
    return "\n".join(lines)


def ablation(r: dict) -> str:
    """One row per (workload, budget, arm): probes passed with a Wilson 95% interval, evictions, recoveries."""
    lines = [f"`bench ablation --seeds {r['seeds']} --budgets {','.join(map(str, r['budgets']))} "
             f"--workloads {','.join(r['workloads'])}`. {_machine(r)}", "",
             "| workload | budget | signal | passed | rate [95% CI] | evictions | recoveries | seconds |",
             "|---|---:|---|---:|---|---:|---:|---:|"]
    for row in r["rows"]:
        low, high = row["wilson95"]
        lines.append(f"| {row['workload']} | {row['budget'] or '-'} | {row['arm']} | {row['passed']}/{row['n']} | "
                     f"**{row['rate']:.2f}** [{low:.2f}, {high:.2f}] | {row['evictions']} | {row['recoveries']} | "
                     f"{row['seconds']} |")
    lines += ["", "Pooled over the budgets (the ceiling never evicts, so it has no budget):", "",
              "| signal | " + " | ".join(r["workloads"]) + " | both workloads |",
              "|---|" + "---:|" * (len(r["workloads"]) + 1)]
    for arm in dict.fromkeys(row["arm"] for row in r["rows"]):
        cells, total_k, total_n = [], 0, 0
        for workload in r["workloads"]:
            rows = [row for row in r["rows"] if row["arm"] == arm and row["workload"] == workload]
            k, n = sum(row["passed"] for row in rows), sum(row["n"] for row in rows)
            cells.append(_pooled(k, n))
            total_k, total_n = total_k + k, total_n + n
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {_pooled(total_k, total_n)} |")
    return "\n".join(lines)


def _pooled(k: int, n: int) -> str:
    from .recall_suite import wilson

    if n == 0:
        return "-"
    low, high = wilson(k, n)
    return f"{k}/{n} = **{k / n:.2f}** [{low:.2f}, {high:.2f}]"


def endpoint(r: dict) -> str:
    from .endpoint import table

    return (f"`bench endpoint --seeds {r['seeds']} --budget {r['budget_tokens']}` ({r['n_threads']} thread(s), "
            f"embedder {r['embedder']}, median of {r['seeds']} sessions). {_machine(r)}\n\n{table(r)}")


def main(paths: list[str]) -> None:
    for path in paths:
        with open(path) as fh:
            result = json.load(fh)
        render = {"restore": restore, "recall": recall, "recall_suite": recall_suite, "endpoint": endpoint,
                  "edit": edit, "ablation": ablation, "retrieval": retrieval}.get(result["bench"], simple)
        print(render(result))
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
