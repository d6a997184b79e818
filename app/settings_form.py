"""The settings dialog's logic, headless: field specs from `Settings.describe()`, parsing, validation.

Invariant: every setting the engine declares appears exactly once, with its default, range,
choices and when it applies; `build` returns a validated Settings or raises ValueError.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from evoke_engine.settings import KV_FILE_SETTINGS, NOW, RELOAD

GROUP_TITLES = {"Conversation": "System prompt", "Persistence": "Persistence & keep-alive"}
LABELS = {
    "model_path": "Model file", "n_ctx": "Context length", "n_gpu_layers": "GPU layers",
    "n_threads": "Threads", "n_batch": "Batch size", "kv_cache_type": "KV cache type",
    "flash_attention": "Flash attention", "slots": "Conversation slots", "slot_layout": "Slot layout",
    "budget_tokens": "Budget", "high_watermark": "High watermark", "low_watermark": "Low watermark",
    "tail_fraction": "Protected tail", "block_tokens": "Block size", "recovery": "Recovery backend",
    "recovery_top_k": "Recovery top-K", "ram_budget_bytes": "RAM budget", "embedder": "Embedder model",
    "disk_budget_bytes": "KV disk cap", "kv_file_bits": "KV file bits", "ttl_short_s": "TTL short",
    "ttl_long_s": "TTL long",
    "ttl_extended_s": "TTL extended (pinned)", "keepalive_interval_s": "Keep-alive interval",
    "eviction_interval_s": "Eviction sweep interval", "model_idle_unload_s": "Unload model when idle",
    "system_prompt": "System prompt", "tools_enabled": "Tool schema in prefix",
    "top_p": "Top-p", "top_k": "Top-k", "min_p": "Min-p", "max_tokens": "Max reply tokens",
    "server_enabled": "Serve the API endpoint", "server_host": "Endpoint address", "server_port": "Endpoint port",
    "api_key": "Endpoint API key", "server_max_request_bytes": "Largest request (bytes)",
    "rpc_servers": "Remote devices (RPC)", "rpc_layer_split": "Layer share per device",
    "rpc_skip_unreachable": "Load without unreachable remote devices", "text_size": "Text size",
}
MIB = 1 << 20
_REBUILT = "saved KV caches were made for the old {what}: each conversation re-reads its history once when opened"
_KV_FILE_WHAT = {"model_path": "model", "kv_cache_type": "KV cache type", "n_ctx": "context length",
                 "slots": "slot count", "flash_attention": "flash attention setting (it decides how V is stored)"}
SAVED_STATE_EFFECTS = {          # what a change does to conversations saved to disk and open ones
    **{name: _REBUILT.format(what=_KV_FILE_WHAT[name]) for name in KV_FILE_SETTINGS},
    "embedder": "similarity vectors are recomputed with the new embedder when needed; the saved K/V is kept "
                "(no re-read of the history)",
    "block_tokens": "saved blocks keep their size and nothing is recomputed; new messages use the new size",
}


@dataclass(frozen=True)
class FieldSpec:
    name: str
    label: str
    group: str
    description: str
    default: Any
    kind: str                 # int | float | bool | choice | text | bytes | model | prompt
    applies: str
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] | None = None      # values of the setting's type (shown as text)
    optional: bool = False    # None is a valid value (empty means "the default")

    @property
    def unit(self) -> str:
        if self.kind == "bytes":
            return "MiB"
        if self.name.endswith("_s"):
            return "s"
        if self.name in ("budget_tokens", "block_tokens", "n_ctx", "max_tokens"):
            return "tokens"
        if self.name == "text_size":
            return "%"
        return ""

    @property
    def applies_text(self) -> str:
        return "applies now" if self.applies == NOW else "after model reload"

    def format(self, value: Any) -> str:
        if value is None or value == "":
            return "(embedded)" if self.kind == "model" else "(built in)"
        if self.kind == "bytes":
            return human_bytes(int(value))
        if self.kind == "bool":
            return "on" if value else "off"
        if self.kind == "prompt":
            return f"{len(str(value))} characters"
        return f"{value} {self.unit}".strip()

    @property
    def default_text(self) -> str:
        return f"default: {self.format(self.default)}"

    def range_text(self) -> str:
        if self.low is None:
            return ""
        if self.kind == "bytes":
            return f"{human_bytes(int(self.low))} to {human_bytes(int(self.high or 0))}"
        return f"{human_count(self.low)} to {human_count(self.high)}"

    def check(self, value: Any) -> str | None:
        """A readable problem with `value`, or None."""
        if value is None:
            return None if self.optional else f"{self.label}: a value is required"
        if self.choices and value not in self.choices:
            return f"{self.label}: choose one of {', '.join(map(str, self.choices))}"
        if self.low is not None and self.high is not None and not (self.low <= value <= self.high):
            return f"{self.label}: {self.format(value)} is outside {self.range_text()}"
        return None


def human_count(value: float | None) -> str:
    """A declared bound as the dialog shows it (262144, 0.5)."""
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def human_bytes(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}".replace(".0 ", " ")
    return f"{n} B"


def _kind(meta: dict[str, Any]) -> str:
    name, typ = meta["name"], str(meta.get("type", ""))
    if name == "model_path":
        return "model"
    if name == "system_prompt":
        return "prompt"
    if meta.get("choices"):
        return "choice"
    if "bool" in typ:
        return "bool"
    if name.endswith("_bytes"):
        return "bytes"
    if "float" in typ:
        return "float"
    if "int" in typ:
        return "int"
    return "text"


def field_specs(settings_cls: type) -> list[FieldSpec]:
    specs = []
    for meta in settings_cls.describe():
        name = meta["name"]
        specs.append(FieldSpec(
            name=name, label=LABELS.get(name, name.replace("_", " ").capitalize()),
            group=meta.get("group", "Other"), description=meta.get("description", ""),
            default=meta.get("default"), kind=_kind(meta), applies=meta.get("applies", NOW),
            low=meta.get("low"), high=meta.get("high"),
            choices=tuple(meta["choices"]) if meta.get("choices") else None,
            optional="None" in str(meta.get("type", "")) or meta.get("default") is None))
    return specs


def grouped(specs: list[FieldSpec]) -> dict[str, list[FieldSpec]]:
    """Specs by group, in declaration order of the groups."""
    groups: dict[str, list[FieldSpec]] = {}
    for spec in specs:
        groups.setdefault(spec.group, []).append(spec)
    return groups


def to_editor(spec: FieldSpec, value: Any) -> Any:
    """The value an editor shows (bytes in MiB, None as empty text)."""
    if spec.kind == "bytes":
        return value / MIB
    if value is None and spec.kind in ("text", "prompt"):
        return ""
    return value


def from_editor(spec: FieldSpec, shown: Any) -> Any:
    """The setting value of what an editor shows."""
    if spec.kind == "bytes":
        return int(round(float(shown) * MIB))
    if spec.kind == "int":
        return int(shown)
    if spec.kind == "float":
        return float(shown)
    if spec.kind == "bool":
        return bool(shown)
    if spec.kind in ("text", "prompt", "model"):
        text = (shown or "").strip() if spec.kind != "prompt" else (shown or "")
        if not text.strip() and spec.optional:
            return None
        return text
    if spec.kind == "choice":
        return next((choice for choice in spec.choices or () if str(choice) == str(shown)), shown)
    return shown


def build(base: Any, values: dict[str, Any], specs: list[FieldSpec]) -> Any:
    """A validated copy of `base` with `values` (setting values) applied, or ValueError."""
    problems = [p for s in specs if s.name in values and (p := s.check(values[s.name]))]
    if problems:
        raise ValueError("; ".join(problems))
    return dataclasses.replace(base, **values)


def location(name: str, specs: list[FieldSpec]) -> str:
    """Where the setting `name` is changed in the window: Settings → its tab → its label."""
    spec = next((s for s in specs if s.name == name), None)
    if spec is None:
        return "Settings"
    return f"Settings → {GROUP_TITLES.get(spec.group, spec.group)} → {spec.label}"


def file_problems_text(problems: list[Any], specs: list[FieldSpec]) -> str:
    """The banner's text for the saved settings that were not used (`evoke_engine.settings.SettingProblem`s):
    each field, why, and where to change it; the file once."""
    if not problems:
        return ""
    lines = [f"Some saved settings were not used (file: {problems[0].path}):"]
    for problem in problems:
        where = " and ".join(location(name, specs) for name in problem.names)
        lines.append(f"• {problem.detail}." + (f" Change it in {where}." if where else ""))
    return "\n".join(lines)


def budget_floor_text(budget: int, smallest: int, specs: list[FieldSpec]) -> str:
    """The banner's text for a saved budget below the smallest that works (an older install's 512)."""
    return (f"The saved budget ({budget} tokens) is below the smallest that works with this model and system "
            f"prompt ({smallest} tokens): new conversations are refused until it is raised. Change it in "
            f"{location('budget_tokens', specs)}.")


def recompute_notes(old: Any, new: dict[str, Any] | Any, specs: list[FieldSpec]) -> list[str]:
    """What changing `old` to `new` (Settings or setting values) recomputes in saved and open conversations."""
    def value(name: str) -> Any:
        return new.get(name, getattr(old, name)) if isinstance(new, dict) else getattr(new, name)
    return [f"{spec.label}: {SAVED_STATE_EFFECTS[spec.name]}" for spec in specs
            if spec.name in SAVED_STATE_EFFECTS and value(spec.name) != getattr(old, spec.name)]


def changed(old: Any, new: Any, specs: list[FieldSpec]) -> tuple[list[str], list[str]]:
    """(names that apply now, names that need a reload) among those that differ."""
    now, reload = [], []
    for spec in specs:
        if getattr(old, spec.name) != getattr(new, spec.name):
            (reload if spec.applies == RELOAD else now).append(spec.name)
    return now, reload
