"""`bench long`'s plots: first token, decode speed and process RSS against conversation length, one PNG each, every
system a line (matplotlib, no display needed).

Invariants: drawn from the printed JSON only (so a saved result can be re-plotted:
`python -m benchmarks.long_plots result.json docs/`); first tokens are those of the short questions (the
turns whose message is comparable across the session); failed turns are left out, never drawn as zero.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .long_workload import COMPARABLE

PLOTS = (("ttft", "ttft_s", "first token of a short question (s)", COMPARABLE, 1.0),
         ("decode", "decode_tok_s", "decode speed (tokens/s)", None, 1.0),
         ("rss", "rss_bytes", "process RSS (MiB)", None, 1 / (1 << 20)))


def plot(result: dict, out_dir: str, prefix: str = "long-chat") -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    machine = result.get("machine", {})
    subtitle = (f"bench long, seed {result['seed']}, {result['turns']} turns; {machine.get('processor', '?')}, "
                f"{machine.get('cores', '?')} cores, {machine.get('date', '?')}")
    for name, key, label, kinds, scale in PLOTS:
        fig, ax = plt.subplots(figsize=(9, 5))
        for system, rows in result["rows"].items():
            points = [(r["conversation_tokens"], r[key] * scale) for r in rows
                      if not r.get("error") and r.get(key) is not None and r.get("conversation_tokens")
                      and (kinds is None or r["kind"] in kinds)]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.2, label=system)
        ax.set_xlabel("conversation length (tokens)")
        ax.set_ylabel(label)
        if name == "ttft":
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(subtitle, fontsize=9)
        fig.tight_layout()
        path = out / f"{prefix}-{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    return written


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        print("\n".join(plot(json.load(fh), sys.argv[2] if len(sys.argv) > 2 else "docs")))
