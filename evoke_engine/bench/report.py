"""Markdown tables from the JSON the benches print (so docs/benchmarks.md copies figures, never retypes them).

Usage: python -m evoke_engine.bench.report restore.json recall.json switch.json reopen.json prewarm.json
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


def endpoint(r: dict) -> str:
    from .endpoint import table

    return (f"`bench endpoint --seeds {r['seeds']} --budget {r['budget_tokens']}` ({r['n_threads']} thread(s), "
            f"embedder {r['embedder']}, median of {r['seeds']} sessions). {_machine(r)}\n\n{table(r)}")


def main(paths: list[str]) -> None:
    for path in paths:
        with open(path) as fh:
            result = json.load(fh)
        render = {"restore": restore, "recall": recall, "endpoint": endpoint, "edit": edit}.get(result["bench"], simple)
        print(render(result))
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
