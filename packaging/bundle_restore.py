"""A block restore from the one-folder bundle against the same restore from a venv, side by side in one run, as JSON:
`python3 packaging/bundle_restore.py [dist/evoke-desk] [--venv .venv] [--sizes 512] [--trials 5] [--rounds 3]`.

Both sides run the one code path, `benchmarks.__main__.main(["restore", ...])`: the venv as `python -m benchmarks
restore --json ...` from this checkout, the bundle as `evoke-desk bench restore --json ...` (packaging/launcher.py).
Invariants: each round runs both, in turns (the one that goes first alternates), from the same scrubbed environment
(`env -i` plus PATH=/usr/bin:/bin and a fresh home, as tests/integration/test_bundle.py); a figure is the median over
rounds of each run's own median; `ratio` is bundle / venv, and `within_1_2x` holds the issue's bar (issue 62) for the
restore call. The load average is printed with the figures: above the cores, they are not comparable. Standard
library only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from time_bundle import cpu_model  # this folder's sibling: the same machine line as the bundle's timings

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ("restore_call_ms", "restore_ms", "save_ms", "llama_shift_restore_ms", "reprefill_ms")
BAR = 1.2                                   # issue 62: the bundle's restore within 1.2x of the venv's


def scrubbed(home: Path, variant: str | None) -> dict[str, str]:
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "QT_QPA_PLATFORM": "offscreen"}
    if variant:
        env["EVOKE_NATIVE_VARIANT"] = variant
    return env


def bench(cmd: list[str], env: dict[str, str], cwd: Path) -> dict:
    """One `restore` run's JSON (its stderr's tail in the error when it fails)."""
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def summary(runs: list[dict]) -> dict:
    """Per size, the median over runs of each figure, the KV path each run took, and what loaded."""
    first = runs[0]
    rows = []
    for index, row in enumerate(first["rows"]):
        per_run = [run["rows"][index] for run in runs]
        rows.append({"tokens": row["tokens"], "bytes": row["bytes"], "paths": sorted({r["path"] for r in per_run}),
                     **{name: round(statistics.median(r[name] for r in per_run), 3) for name in FIGURES},
                     "restore_call_ms_runs": [r["restore_call_ms"] for r in per_run]})
    return {"device": first["device"], "direct_path": all(run["direct_path"] for run in runs),
            "direct_note": first["direct_note"], "native_reanchor": all(run["native_reanchor"] for run in runs),
            "llama_device": first["machine"].get("llama_device"),
            "busy_at_start": any(run["machine"].get("busy_at_start") for run in runs), "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bundle", nargs="?", default="dist/evoke-desk", help="the bundle's folder")
    parser.add_argument("--venv", default=".venv", help="the venv whose `python -m benchmarks restore` is compared")
    parser.add_argument("--sizes", default="512", help="block sizes in tokens, comma-separated")
    parser.add_argument("--trials", type=int, default=5, help="trials per size within one run (its median)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side, in turns")
    parser.add_argument("--bundle-variant", default=None, help="EVOKE_NATIVE_VARIANT for the bundle (e.g. baseline: "
                        "the no-AVX native libraries); default: the best variant this CPU runs")
    args = parser.parse_args()
    exe = Path(args.bundle).resolve() / "evoke-desk"
    python = Path(args.venv).resolve() / "bin" / "python"
    for path in (exe, python):
        if not path.is_file():
            parser.error(f"{path} does not exist (`make bundle` builds the bundle, `make install` the venv)")
    options = ["restore", "--json", "--sizes", args.sizes, "--trials", str(args.trials)]
    sides = {"venv": [str(python), "-m", "benchmarks", *options], "bundle": [str(exe), "bench", *options]}
    runs: dict[str, list[dict]] = {"venv": [], "bundle": []}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bundle-restore-") as tmp:
        for round_index in range(args.rounds):
            order = ("venv", "bundle") if round_index % 2 == 0 else ("bundle", "venv")
            for side in order:
                home = Path(tmp) / f"{side}-{round_index}"
                home.mkdir()
                env = scrubbed(home, args.bundle_variant if side == "bundle" else None)
                # the venv's from the checkout (its `benchmarks` package), the bundle's from outside it
                runs[side].append(bench(sides[side], env, ROOT if side == "venv" else home))
                print(f"bundle_restore: round {round_index + 1}/{args.rounds}, {side} done", file=sys.stderr)
    venv, bundle = summary(runs["venv"]), summary(runs["bundle"])
    ratios = []
    for v_row, b_row in zip(venv["rows"], bundle["rows"], strict=True):
        ratio = {name: round(b_row[name] / v_row[name], 2) if v_row[name] else None for name in FIGURES}
        ratios.append({"tokens": v_row["tokens"], **ratio,
                       "within_1_2x": ratio["restore_call_ms"] is not None and ratio["restore_call_ms"] <= BAR,
                       "both_direct": v_row["paths"] == b_row["paths"] == ["direct"]})
    memory_gib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 30
    report = {"machine": f"{cpu_model()}, {os.cpu_count()} cores, {memory_gib} GiB", "date": time.strftime("%Y-%m-%d"),
              "load_before": load_before, "load_after": os.getloadavg()[0], "rounds": args.rounds,
              "commands": {side: " ".join(cmd) for side, cmd in sides.items()},
              "bundle_variant": args.bundle_variant or "best", "ratio_bundle_over_venv": ratios,
              "venv": venv, "bundle": bundle}
    if max(report["load_before"], report["load_after"]) > (os.cpu_count() or 1) or venv["busy_at_start"] \
            or bundle["busy_at_start"]:
        report["note"] = "load average above the cores during the run: the times are not comparable"
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
