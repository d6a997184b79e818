"""`GET /metrics`: the endpoint's counters in Prometheus' text exposition format (version 0.0.4), written by hand
(prometheus_client is not a dependency; the format is plain text).

Invariants: counters only grow; every finished chat request is observed once (`observe`, from its `evoke`
figures), its prompt tokens counted once, as cached, decoded or reused; the engine's own events (KV files restored,
blocks spilled, conversations released: also those of the window and of sweeps) are counted as they are emitted
(`on_event`); the TTFT and queue-wait histograms (from a request's arrival; a reply's wait for its turn to start) have
cumulative buckets with `+Inf` equal to the count;
the KV files' disk bytes are read from the folder when scraped (a missing folder reads 0).
"""

from __future__ import annotations

import threading
from pathlib import Path

TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
COUNTERS = {
    "requests": "completion requests finished (chat and raw)",
    "prompt_tokens": "prompt tokens of finished requests",
    "cached_tokens": "prompt tokens held in the KV before the request (prefix, earlier turns, restored blocks)",
    "decoded_tokens": "prompt tokens decoded",
    "completion_tokens": "tokens generated",
    "evictions": "blocks evicted from the KV cache during requests",
    "recoveries": "evicted blocks recovered during requests",
    "reused_tokens": "prompt tokens spliced in from other conversations' KV (prompt = cached + decoded + reused)",
}
EVENT_COUNTERS = {          # EventKind value -> (counter, help); each also counts its tokens as <counter>_tokens
    "kv_restored": ("restores", "conversations reopened from their KV file without a prefill"),
    "kv_rebuilt": ("rebuilds", "conversations whose KV was rebuilt from the history (a file unusable or gone)"),
    "spilled": ("spills", "saved blocks moved from the RAM pool to disk"),
    "released": ("releases", "idle conversations saved to disk and let go of memory"),
}


class Histogram:
    """Seconds observed into cumulative buckets (`TTFT_BUCKETS_S`), Prometheus' histogram; the caller locks."""

    def __init__(self, name: str, help_text: str) -> None:
        self.name, self.help_text = name, help_text
        self.counts = [0] * len(TTFT_BUCKETS_S)
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.sum += seconds
        self.count += 1
        for i, bound in enumerate(TTFT_BUCKETS_S):
            if seconds <= bound:
                self.counts[i] += 1

    def lines(self) -> list[str]:
        name = self.name
        return [f"# HELP {name} {self.help_text}", f"# TYPE {name} histogram",
                *(f'{name}_bucket{{le="{bound}"}} {count}' for bound, count in zip(TTFT_BUCKETS_S, self.counts,
                                                                                 strict=True)),
                f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.sum:.6f}", f"{name}_count {self.count}"]


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.totals = dict.fromkeys(COUNTERS, 0)
        self.events = {name: [0, 0] for name, _ in EVENT_COUNTERS.values()}      # name -> [count, tokens]
        self.ttft = Histogram("evoke_time_to_first_token_seconds", "time from a request's arrival to its reply's "
                              "first token")
        self.queue_wait = Histogram("evoke_queue_wait_seconds", "time a reply waited for its turn to start behind "
                                    "other replies (parallel_replies)")

    def observe(self, usage: dict, figures: dict) -> None:
        """One finished request: its OpenAI usage and its `evoke` figures."""
        with self._lock:
            t = self.totals
            t["requests"] += 1
            t["prompt_tokens"] += int(usage.get("prompt_tokens", 0))
            t["completion_tokens"] += int(usage.get("completion_tokens", 0))
            for key, name in (("cached_tokens", "cached"), ("decoded_tokens", "decoded"), ("evictions", "evictions"),
                              ("recoveries", "recoveries"), ("reused_tokens", "reused")):
                t[key] += max(0, int(figures.get(name, 0)))
            self.ttft.observe(float(figures.get("ttft_ms", figures.get("engine_ttft_ms", 0.0))) / 1000)  # arrival
            if "queue_ms" in figures:                            # a chat reply (a raw completion runs as a job)
                self.queue_wait.observe(float(figures["queue_ms"]) / 1000)

    def on_event(self, event) -> None:
        """An engine event (`Engine.subscribe`, any thread): counted when it is one of `EVENT_COUNTERS`."""
        known = EVENT_COUNTERS.get(str(event.kind))
        if known is not None:
            with self._lock:
                counted = self.events[known[0]]
                counted[0] += 1
                counted[1] += max(0, int(event.tokens))

    def render(self, gauges: dict[str, tuple[str, float]], kv_folder: Path | None) -> str:
        """The exposition text: counters, the TTFT histogram, `gauges` (name -> (help, value)), KV disk bytes."""
        lines: list[str] = []
        with self._lock:
            for key, help_text in COUNTERS.items():
                name = f"evoke_{key}_total"
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name} {self.totals[key]}"]
            for key, help_text in EVENT_COUNTERS.values():
                count, tokens = self.events[key]
                for name, text, value in ((f"evoke_{key}_total", help_text, count),
                                          (f"evoke_{key}_tokens_total", f"tokens of {help_text}", tokens)):
                    lines += [f"# HELP {name} {text}", f"# TYPE {name} counter", f"{name} {value}"]
            lines += self.ttft.lines() + self.queue_wait.lines()
        disk = 0
        if kv_folder is not None and kv_folder.is_dir():
            disk = sum(p.stat().st_size for p in kv_folder.rglob("*") if p.is_file())
        gauges = {**gauges, "kv_disk_bytes": ("bytes of KV files on disk", float(disk))}
        for key, (help_text, value) in gauges.items():
            name = f"evoke_{key}"
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value:g}"]
        return "\n".join(lines) + "\n"
