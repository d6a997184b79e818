"""Where each "applies now" setting is used, and how a change reaches that user (engine thread only).

Invariants: every Settings field marked applies="now" has a reader here that reads the value from
the object that uses it (not from `engine.settings`); `push` hands a change to every object that
copied the value at construction, so after `Engine.apply_settings` each reader returns the new value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .sampling import SamplingParams
from .settings import NOW, Settings

if TYPE_CHECKING:
    from .engine import Engine
    from .memory import ConversationMemory

Reader = Callable[["Engine", "ConversationMemory"], Any]

_LIVE_IN_MEMORY = ("high_watermark", "low_watermark", "tail_fraction", "block_tokens", "recovery", "recovery_top_k",
                  "recall_signal", "recall_user_margin", "attention_aggregation")
_LIVE_IN_SCORER = ("weight_similarity", "weight_focus", "weight_recency", "recency_half_life_turns",
                   "user_floor", "assistant_floor", "weight_attention")
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "max_tokens", "seed")
_TTL_CLASS = {"ttl_short_s": "short", "ttl_long_s": "long", "ttl_extended_s": "extended"}


def _job_interval(job_id: str) -> Reader:
    def read(engine: Engine, memory: ConversationMemory) -> Any:
        if engine.sweeps is None:                     # no scheduler: nothing runs the job
            return getattr(engine.settings, f"{job_id}_interval_s")
        return next(int(j["interval_s"]) for j in engine.sweeps.jobs() if j["id"] == job_id)
    return read


READERS: dict[str, Reader] = {
    "budget_tokens": lambda e, m: m.budget_tokens,
    **{name: (lambda e, m, n=name: getattr(m.settings, n)) for name in _LIVE_IN_MEMORY},
    **{name: (lambda e, m, n=name: getattr(m.scorer.s, n)) for name in _LIVE_IN_SCORER},
    **{name: (lambda e, m, n=name: getattr(SamplingParams.from_settings(e.settings), n)) for name in _SAMPLING},
    **{name: (lambda e, m, c=cls: e.kvfiles.ttl_seconds[c]) for name, cls in _TTL_CLASS.items()},
    "ram_budget_bytes": lambda e, m: e.pool.ram_budget_bytes,
    "pool_bits": lambda e, m: e.pool.bits,
    "embedder": lambda e, m: m.embedder.name,
    "focus_ema": lambda e, m: m.focus.ema,
    "focus_snap_cosine": lambda e, m: m.focus.snap_cosine,
    "system_prompt": lambda e, m: e.settings.system_prompt,          # read by new_conversation
    "tools_enabled": lambda e, m: e.settings.tools_enabled,          # read by new_conversation
    "disk_budget_bytes": lambda e, m: e.settings.disk_budget_bytes,  # read by each eviction sweep
    "model_idle_unload_s": lambda e, m: e.settings.model_idle_unload_s,  # read by each idle check
    # The endpoint's settings are applied by whoever runs the server (app/endpoint.py, `serve`) from these:
    **{name: (lambda e, m, n=name: getattr(e.settings, n))
       for name in ("server_enabled", "server_host", "server_port", "api_key", "server_max_request_bytes")},
    "theme": lambda e, m: e.settings.theme,                          # read by the window (app/theme.py)
    "keepalive_interval_s": _job_interval("keepalive"),
    "eviction_interval_s": _job_interval("eviction"),
}


def now_fields() -> list[str]:
    return [f.name for f in dataclasses.fields(Settings) if f.metadata.get("applies") == NOW]


def in_use(engine: Engine, memory: ConversationMemory) -> dict[str, Any]:
    """The value of every "applies now" setting as the object that uses it holds it."""
    return {name: READERS[name](engine, memory) for name in now_fields()}


def ttl_seconds(settings: Settings) -> dict[str, int]:
    return {cls: getattr(settings, name) for name, cls in _TTL_CLASS.items()}


def push(engine: Engine, old: Settings, memories: list[ConversationMemory]) -> None:
    """Hand the changes between `old` and `engine.settings` to the objects that copied them."""
    new = engine.settings
    changed = {name for name in now_fields() if getattr(old, name) != getattr(new, name)}
    if engine.rt is not None:
        if "ram_budget_bytes" in changed:
            engine.pool.set_budget(new.ram_budget_bytes)
        if "pool_bits" in changed:
            engine.pool.set_bits(new.pool_bits)
        if "embedder" in changed:
            engine.switch_embedder()          # open conversations drop old vectors, focus recomputed
    if engine.kvfiles is not None and changed & set(_TTL_CLASS):
        engine.kvfiles.set_ttl_seconds(ttl_seconds(new))
    for memory in memories:
        if "budget_tokens" in changed:
            memory.set_budget(new.budget_tokens)
        memory.focus.ema, memory.focus.snap_cosine = new.focus_ema, new.focus_snap_cosine
    if engine.sweeps is not None:
        engine.sweeps.schedule()
