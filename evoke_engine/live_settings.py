"""Where each "applies now" setting is used, and how a change reaches that user (engine thread only).

Invariants: every Settings field marked applies="now" has a reader here that reads the value from
the object that uses it (not from the settings object, unless that object is its user); `push` hands a
change to every object that copied the value at construction, so after `Engine.apply_settings` each reader
returns the new value. Readers and `push` see `LiveTargets` (the engine-wide users) and a conversation's memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .sampling import SamplingParams
from .settings import NOW, Settings
from .store.kvnames import TTL_CLASSES

if TYPE_CHECKING:
    from .loaded_model import LoadedModel
    from .memory import ConversationMemory
    from .scheduler import Sweeps
    from .store.kvfiles import KVFileStore


@dataclass(frozen=True)
class LiveTargets:
    """The engine-wide users of "applies now" settings, as they are now (engine thread)."""

    settings: Settings                        # read where it is read at each use (new conversations, sweeps)
    model: LoadedModel | None                 # its pool; None while the model is unloaded
    files: KVFileStore | None                 # TTLs (the files outlive the model)
    sweeps: Sweeps | None                     # job intervals; None without a scheduler
    switch_embedder: Callable[[], None]       # open conversations drop old vectors, focus recomputed


Reader = Callable[[LiveTargets, "ConversationMemory"], Any]

_LIVE_IN_MEMORY = ("high_watermark", "low_watermark", "tail_fraction", "block_tokens", "recovery", "recovery_top_k",
                  "recall_signal", "recall_user_margin", "recovery_margin", "attention_aggregation")
_LIVE_IN_SCORER = ("weight_similarity", "weight_focus", "weight_recency", "recency_half_life_turns",
                   "user_floor", "assistant_floor", "weight_attention")
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "max_tokens", "seed")
_TTL_CLASS = {f"ttl_{cls}_s": cls for cls in TTL_CLASSES}          # the setting of each TTL class


def _job_interval(job_id: str) -> Reader:
    def read(targets: LiveTargets, memory: ConversationMemory) -> Any:
        if targets.sweeps is None:                    # no scheduler: nothing runs the job
            return getattr(targets.settings, f"{job_id}_interval_s")
        return next(int(j["interval_s"]) for j in targets.sweeps.jobs() if j["id"] == job_id)
    return read


READERS: dict[str, Reader] = {
    "budget_tokens": lambda t, m: m.budget_tokens,
    **{name: (lambda t, m, n=name: getattr(m.settings, n)) for name in _LIVE_IN_MEMORY},
    **{name: (lambda t, m, n=name: getattr(m.scorer.s, n)) for name in _LIVE_IN_SCORER},
    **{name: (lambda t, m, n=name: getattr(SamplingParams.from_settings(t.settings), n)) for name in _SAMPLING},
    **{name: (lambda t, m, c=cls: t.files.ttl_seconds[c]) for name, cls in _TTL_CLASS.items()},
    "ram_budget_bytes": lambda t, m: t.model.pool.ram_budget_bytes,
    "pool_bits": lambda t, m: t.model.pool.bits,
    "embedder": lambda t, m: m.embedder.name,
    "focus_ema": lambda t, m: m.focus.ema,
    "focus_snap_cosine": lambda t, m: m.focus.snap_cosine,
    "system_prompt": lambda t, m: t.settings.system_prompt,          # read by new_conversation
    "tools_enabled": lambda t, m: t.settings.tools_enabled,          # read by new_conversation
    "disk_budget_bytes": lambda t, m: t.settings.disk_budget_bytes,  # read by each eviction sweep
    "model_idle_unload_s": lambda t, m: t.settings.model_idle_unload_s,  # read by each idle check
    # The endpoint's settings are applied by whoever runs the server (app/endpoint.py, `serve`) from these:
    **{name: (lambda t, m, n=name: getattr(t.settings, n))
       for name in ("server_enabled", "server_host", "server_port", "api_key", "server_max_request_bytes")},
    "theme": lambda t, m: t.settings.theme,                          # read by the window (app/theme.py)
    "keepalive_interval_s": _job_interval("keepalive"),
    "eviction_interval_s": _job_interval("eviction"),
}


def now_fields() -> list[str]:
    return [f.name for f in dataclasses.fields(Settings) if f.metadata.get("applies") == NOW]


def in_use(targets: LiveTargets, memory: ConversationMemory) -> dict[str, Any]:
    """The value of every "applies now" setting as the object that uses it holds it."""
    return {name: READERS[name](targets, memory) for name in now_fields()}


def ttl_seconds(settings: Settings) -> dict[str, int]:
    return {cls: getattr(settings, name) for name, cls in _TTL_CLASS.items()}


def push(targets: LiveTargets, old: Settings, memories: list[ConversationMemory]) -> None:
    """Hand the changes between `old` and `targets.settings` to the objects that copied them."""
    new = targets.settings
    changed = {name for name in now_fields() if getattr(old, name) != getattr(new, name)}
    if targets.model is not None:
        if "ram_budget_bytes" in changed:
            targets.model.pool.set_budget(new.ram_budget_bytes)
        if "pool_bits" in changed:
            targets.model.pool.set_bits(new.pool_bits)
        if "embedder" in changed:
            targets.switch_embedder()
    if targets.files is not None and changed & set(_TTL_CLASS):
        targets.files.set_ttl_seconds(ttl_seconds(new))
    for memory in memories:
        if "budget_tokens" in changed:
            memory.set_budget(new.budget_tokens)
        memory.focus.ema, memory.focus.snap_cosine = new.focus_ema, new.focus_snap_cosine
    if targets.sweeps is not None:
        targets.sweeps.schedule()
