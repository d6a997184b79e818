"""Typed settings, declared once: type, default, range, description, and when a change applies.

Invariants: a `Settings` is frozen and validated on construction (a change is a new value, `replace`;
`settings_hub.SettingsHub` swaps the engine's and notifies its consumers). Each field is checked by a pydantic
model derived from these declarations (`field_model`: strict types, so 4096.7 or true is no integer, ranges and
choices), then the checks across fields (`CROSS_FIELD_CHECKS`). Loading a saved file keeps every valid value: a
bad one (or a pair that fails a cross check) keeps its default and becomes a `SettingProblem` naming the field, the
file and why; unknown keys are ignored with a warning, and a file that cannot be read falls back to defaults.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal, get_type_hints

import platformdirs
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from .rpc_split import check_settings as check_rpc_settings
from .store.kvnames import DEFAULT_TTL_SECONDS, TTL_CLASSES
from .store.private import private_file, private_mkdir, private_write_text

log = logging.getLogger(__name__)

APP_NAME = "evoke-desk"
RECOVERY_BACKENDS = ("kv_restore", "breadcrumb", "discard", "none")
KV_CACHE_TYPES = ("f16", "q8_0")
SLOT_LAYOUTS = ("streams", "contexts", "unified")
POOL_BITS = (16, 8, 4)                          # declared here only: pool.py takes it from here
KV_FILE_BITS = (16, 8)                          # memory/file_bits.py
RECALL_SIGNALS = ("block", "lines", "lines+lexical", "block+lexical", "lexical", "fused")   # recall_signals.MODES
ATTENTION_AGGREGATIONS = ("adakv", "mean")     # AttentionSignal.refresh(aggregation=...)
ATTENTION_GQA = ("mean", "max")               # declared here only: attention.py takes it from here
NOW, RELOAD = "now", "reload"
THEMES = ("auto", "dark", "light")            # app/theme.py
# n_gpu_layers' two special values, as llama.cpp's own tools read -ngl (common.h: "-1 is auto, <= -2 is all")
GPU_LAYERS_AUTO, GPU_LAYERS_ALL = -1, -2
TTL_SETTINGS = {f"ttl_{cls}_s": cls for cls in TTL_CLASSES}   # the setting of each KV file TTL class
# The settings a KV file is made for (the parameters of `store.kvfiles.model_hash`): a change of one makes saved
# files unusable, so each conversation re-reads its history once when opened (the settings dialog says so).
KV_FILE_SETTINGS = ("model_path", "kv_cache_type", "n_ctx", "slots", "flash_attention")


def _setting(default: Any, description: str, *, group: str, applies: str = NOW,
             low: float | None = None, high: float | None = None,
             choices: tuple[Any, ...] | None = None) -> Any:
    meta = {"description": description, "group": group, "applies": applies,
            "low": low, "high": high, "choices": choices}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Settings:
    # Model
    model_path: str | None = _setting(
        None, "GGUF model file; empty means the embedded SmolLM2-135M-Instruct.",
        group="Model", applies=RELOAD)
    n_ctx: int = _setting(16384, "KV cells of the slots in all: split evenly among the slots (streams, "
                          "contexts), or shared by them (unified); with streams or contexts the prefixes "
                          "have a context of one slot's share more.",
                          group="Model", applies=RELOAD, low=512, high=262144)
    n_gpu_layers: int = _setting(GPU_LAYERS_AUTO, "Layers offloaded to the GPU: -1 automatic (as many as fit "
                                 "in the free GPU memory with 1 GiB to spare, after llama.cpp's --fit), -2 all, "
                                 "0 none, or a number; CPU builds ignore it.",
                                 group="Model", applies=RELOAD, low=GPU_LAYERS_ALL, high=1000)
    n_threads: int = _setting(0, "CPU threads for decoding. 0 = automatic: the physical cores, less those busy "
                              "with other work when the model loads (llama.cpp's threads spin: one more than the "
                              "idle cores slows every token several times).",
                              group="Model", applies=RELOAD, low=0, high=256)
    n_batch: int = _setting(512, "Largest chunk of prompt tokens decoded in one call.",
                            group="Model", applies=RELOAD, low=32, high=8192)
    kv_cache_type: str = _setting("f16", "Storage type of the K and V cache.",
                                  group="Model", applies=RELOAD, choices=KV_CACHE_TYPES)
    flash_attention: str = _setting("auto", "Flash attention: auto (off on the CPU with an f16 cache, "
                                    "on elsewhere), on or off.", group="Model",
                                    applies=RELOAD, choices=("auto", "on", "off"))
    slots: int = _setting(4, "Conversations held in the context at once.",
                          group="Model", applies=RELOAD, low=1, high=64)
    parallel_replies: int = _setting(3, "Replies generated at once (the window's and the endpoint's, each in its "
                                     "own slot); more wait in order. At most the slots less one. In one context "
                                     "for all slots their tokens share each decode; with a context a slot they "
                                     "take turns a step at a time.",
                                     group="Model", low=1, high=63)
    prefill_step_tokens: int = _setting(32, "While other replies stream, a message's prefill runs at most this many "
                                        "tokens a step between their tokens, fewer where a step would take more than "
                                        "about two of their token steps (measured as they run). Smaller: smoother "
                                        "streams, slower prefill; a GPU wants hundreds.",
                                        group="Model", low=1, high=8192)
    slot_layout: str = _setting("streams", "Where the slots' K/V live. streams: one llama.cpp context with a KV "
                                "stream per slot: each reply attends over its own conversation only, and the "
                                "replies' next tokens share one decode (needs the direct KV path; else contexts). "
                                "contexts: a context per slot, the replies take turns a step each. unified: one "
                                "cache for all slots: shared decodes, but every decode scans every slot's cells.",
                                group="Model", applies=RELOAD, choices=SLOT_LAYOUTS)
    rpc_servers: str = _setting("", "Remote devices (RPC): host:port of each worker (`evoke-desk rpc-worker` on that "
                                "machine), comma-separated; llama.cpp places some layers (weights and their KV cache) "
                                "there. Its RPC protocol has no authentication or encryption: trusted networks or SSH "
                                "tunnels only.", group="Model", applies=RELOAD)
    rpc_layer_split: str = _setting("", "Layer share per device with remote devices, comma-separated: this machine "
                                    "first, then each worker in order (e.g. 1,1,2); empty splits by free memory.",
                                    group="Model", applies=RELOAD)
    rpc_skip_unreachable: bool = _setting(False, "Load without remote devices that do not answer (a notice names "
                                          "them) instead of failing the load.", group="Model", applies=RELOAD)

    # Memory
    budget_tokens: int = _setting(2048, "Active KV tokens per conversation (prefix included).",
                                  group="Memory", low=64, high=262144)
    high_watermark: float = _setting(0.92, "Evict when active tokens cross this share of the budget.",
                                     group="Memory", low=0.1, high=1.0)
    low_watermark: float = _setting(0.70, "Evict down to this share of the budget.",
                                    group="Memory", low=0.05, high=1.0)
    tail_fraction: float = _setting(0.15, "Most recent share of the budget that is never evicted.",
                                    group="Memory", low=0.0, high=0.9)
    block_tokens: int = _setting(128, "Tokens per block when messages and files are split.",
                                 group="Memory", low=16, high=4096)
    recovery: str = _setting("kv_restore", "What happens to evicted blocks that are needed again.",
                             group="Memory", choices=RECOVERY_BACKENDS)
    recovery_top_k: int = _setting(8, "Saved blocks considered for recovery per turn (with an overdraft: the size "
                                   "of the turn's working set, saved or resident).",
                                   group="Memory", low=0, high=64)
    recovery_width_tokens: int = _setting(1024, "The recovery width grows with the budget: recovery_top_k "
                                          "blocks for each this many budget tokens (16 at 2048, 32 at 4096 with "
                                          "the default 8; budgets up to it keep recovery_top_k; 0 off).",
                                          group="Memory", low=0, high=1048576)
    recovery_file_neighbours: bool = _setting(False, "A wide recovery also brings back, where room is left, the "
                                              "saved blocks next to its best file matches in their files (a "
                                              "file's block whose header the question met, and the next one that "
                                              "holds the value).", group="Memory")
    recovery_questions_last: bool = _setting(True, "When the message asks for a value, a recovery wider than "
                                             "recovery_top_k (a budget over recovery_width_tokens) ranks the user's "
                                             "earlier questions that only asked (what, which, how..., no number in "
                                             "them) after every block that states something: an old question "
                                             "shares the asking words, the fact's block holds the answer.",
                                             group="Memory")
    recovery_signal_tops: int = _setting(2, "A recovery wider than recovery_top_k (a budget over "
                                         "recovery_width_tokens) also considers the best this many saved blocks of "
                                         "each recall signal alone (line vectors, BM25), past the fused ranking: "
                                         "a question in other words than the fact's line shares no term with it "
                                         "(0 off).", group="Memory", low=0, high=64)
    recall_signal: str = _setting("fused", "How saved blocks are matched to a message for recovery: one vector "
                                  "per block, or each line's vector (max), optionally fused with BM25 over lines "
                                  "(SQLite FTS5); 'lexical' is a code-aware BM25 alone (identifiers split on _, "
                                  "camelCase and dots, numbers kept), 'fused' line vectors and that BM25 by rank.",
                                  group="Memory", choices=RECALL_SIGNALS)
    recall_file_name_line: bool = _setting(True, "The line signal also reads a file's name as a line of each of its "
                                           "blocks (`file docker api Dockerfile`), so a question about what the "
                                           "file is for (\"the image\", \"the workflow\") meets its code lines.",
                                           group="Memory")
    recall_line_context: bool = _setting(False, "The line signal reads a structured line (a YAML or TOML key, a "
                                         "module constant, a command line's flags) spelled out with its file's name "
                                         "and parent keys (`pool_size: 20` under `database:` in deploy.yaml: "
                                         "\"deploy yaml database pool size: 20\"), so a question in other words "
                                         "meets it.", group="Memory")
    recall_glosses: str = _setting("auto", "On idle time the loaded model writes a short plain-language gloss of "
                                   "each block's value lines (what `STATUS_REFRESH_MS = 4500` means), read by recall "
                                   "beside the line; 'auto': with any model but the embedded SmolLM2-135M (its "
                                   "glosses do not help; a 1.5B coder's raised recall of questions in other words).",
                                   group="Memory", choices=("off", "auto", "on"))
    recall_value_lines: bool = _setting(True, "When the message asks for a value (what, which, how..., no number "
                                        "in it) and the budget is over recovery_width_tokens, only lines that hold "
                                        "one (a number, a quoted literal, key: value, a flag with its argument, a "
                                        "table row, a decision) set a block's line similarity; a block with none "
                                        "(docstrings, prose, imports) ranks after one whose value line matches as "
                                        "well.", group="Memory")
    recall_skip_questions: bool = _setting(False, "A question the user asked earlier for a value (what, which, "
                                           "who, when, where or how, no number in it) holds no fact: the recall "
                                           "signals leave it out, so it no longer outranks the block that answers "
                                           "it; yes/no and tag questions still count. Off by default: it helps the "
                                           "model-free retrieval bench and passkey, but cost 3 of 20 sessions of "
                                           "the 14-turn endpoint session on the 135M model.", group="Memory")
    recall_user_margin: float = _setting(0.0, "A saved user message is recovered only as the best match by this "
                                         "similarity margin (0 off).", group="Memory", low=0.0, high=1.0)
    recovery_margin: float = _setting(-1.0, "Adaptive recovery width: saved blocks scoring within this margin of "
                                      "the best block (saved or resident) come back, up to recovery_top_k; -1 "
                                      "keeps the per-role resident gate (with an overdraft the working set is the "
                                      "gate instead).", group="Memory", low=-1.0, high=1.0)
    recovery_overdraft_tokens: int = _setting(768, "Recover wider: a turn may bring back up to this many tokens past "
                                              "the room under the budget (the splice is cheap); the turn runs over "
                                              "the budget by at most this much and its end evicts back under it, "
                                              "keeping the recovered blocks that ranked best (0 off).",
                                              group="Memory", low=0, high=65536)
    recovery_keep_used: bool = _setting(True, "Keep what the reply used: when a reply quotes a block (a term of it, "
                                        "not in the message, that only that block holds), the turn's other "
                                        "similarity recoveries leave the context at its end (their bytes stay saved "
                                        "and splice back in milliseconds when a later message ranks them again); "
                                        "re-attached and named files stay.", group="Memory")
    chunk_reuse: bool = _setting(True, "Splice a message's blocks from another open conversation's K/V (in its slot or "
                                 "the host pool) when the same tokens follow the same prefix (a prefix-hash match: "
                                 "bit-identical to decoding them), instead of decoding them.", group="Memory")
    chunk_reuse_across_owners: bool = _setting(False, "Let chunk reuse splice K/V from a conversation of another "
                                               "owner (the window's conversations are one owner; each endpoint "
                                               "client token, or the API key, another). Off by default: reuse is a "
                                               "membership oracle: a client that guesses text another one sent sees "
                                               "it was there (usage.evoke.reused, cached tokens, a faster reply).",
                                               group="Memory")
    chunk_reuse_approximate: bool = _setting(False, "Also splice blocks whose tokens match another conversation's "
                                             "after a different prefix (a content-hash match, re-anchored and "
                                             "repaired: near, not equal, to decoding them; on SmolLM2-135M "
                                             "45% of greedy tokens matched a decode, so off).", group="Memory")
    chunk_reuse_repair_tokens: int = _setting(16, "Tokens decoded afresh after each seam of an approximate reuse "
                                              "(where a spliced run starts: they attend to this conversation); the "
                                              "rest is spliced.", group="Memory", low=0, high=4096)
    ram_budget_bytes: int = _setting(2 << 30, "Host RAM for saved K/V blocks before they spill to disk.",
                                     group="Memory", low=0, high=1 << 40)
    pool_bits: int = _setting(16, "Bits per saved K/V value in host RAM, spill files and KV files, for blocks evicted "
                              "from now on: 16 keeps llama.cpp's f16 bytes; 8 packs keys per channel and values per "
                              "token (KIVI) to 0.51x the bytes, 4 (groups of 32) to 0.31x, so the RAM budget holds "
                              "~2x or ~3x the blocks. Measured on SmolLM2-135M: the same greedy tokens after a restore "
                              "at both, logits within 0.81 (8) and 0.85 (4) of the 16-bit restore; ~8 ms to pack and "
                              "~8 ms to unpack a 128-token block on 2 CPU cores. A q8_0 cache is kept as it is.",
                              group="Memory", choices=POOL_BITS)
    pool_pinned_share: float = _setting(0.25, "Share of the machine's RAM the saved K/V blocks may take as page-locked "
                                        "(pinned) memory on a CUDA build, so a block crosses PCIe at the link's speed "
                                        "(also capped by the RAM budget); elsewhere, or where pinning fails (a log "
                                        "line says so), the same memory is kept pre-faulted and pageable. 0: "
                                        "ordinary allocations.", group="Memory", applies=RELOAD, low=0.0, high=0.75)
    kv_direct: bool = _setting(True, "Move K/V blocks straight between the cache's layer tensors and host RAM (one "
                               "copy per layer, the re-anchor fused with it on the CPU, llama.cpp's K-shift on a GPU); "
                               "off, or where the cache is not covered (sliding-window, recurrent), through "
                               "llama.cpp's serialised state. The bytes are the same either way.", group="Memory",
                               applies=RELOAD)
    spill_budget_bytes: int = _setting(4 << 30, "Disk for saved K/V blocks spilled past the RAM budget; past it "
                                       "the least recently used are dropped (their text still rebuilds them).",
                                       group="Memory", applies=RELOAD, low=0, high=1 << 44)
    embedder: str = _setting("", "Sentence-transformers model name or path; empty is the bundled MiniLM, "
                             "'off' disables similarity.", group="Memory")

    # Scorer
    weight_similarity: float = _setting(1.0, "Weight of similarity to the current message.",
                                        group="Scorer", low=0.0, high=10.0)
    weight_focus: float = _setting(0.5, "Weight of similarity to the task focus.",
                                   group="Scorer", low=0.0, high=10.0)
    weight_recency: float = _setting(0.5, "Weight of recency.", group="Scorer", low=0.0, high=10.0)
    recency_half_life_turns: float = _setting(4.0, "Turns after which recency halves.",
                                              group="Scorer", low=0.1, high=1000.0)
    focus_ema: float = _setting(0.3, "Weight of a new message in the task-focus average.",
                                group="Scorer", low=0.0, high=1.0)
    focus_snap_cosine: float = _setting(0.3, "Below this cosine the focus snaps to the new message.",
                                        group="Scorer", low=-1.0, high=1.0)
    user_floor: float = _setting(0.6, "Lowest score of a user block.", group="Scorer", low=0.0, high=1.0)
    assistant_floor: float = _setting(0.5, "Lowest score of an assistant block.",
                                      group="Scorer", low=0.0, high=1.0)

    # The model's own attention as a signal (native/attention_capture.cpp); off until it wins the ablation
    attention_capture: bool = _setting(False, "Capture the model's own attention per block (llama.cpp's cb_eval) "
                                       "and use it as a scorer signal.", group="Attention", applies=RELOAD)
    attention_layers: str = _setting("", "Layers whose attention is captured, comma-separated; empty is one "
                                     "layer at about two thirds of the depth.", group="Attention", applies=RELOAD)
    attention_gqa: str = _setting("mean", "How the query heads of one KV head are combined: mean or max.",
                                  group="Attention", applies=RELOAD, choices=ATTENTION_GQA)
    weight_attention: float = _setting(1.0, "Weight of the attention signal (when captured).",
                                       group="Attention", low=0.0, high=10.0)
    attention_aggregation: str = _setting("adakv", "Attention across heads: Ada-KV's adaptive top-B (adakv) or "
                                          "the mean over heads.", group="Attention", choices=ATTENTION_AGGREGATIONS)

    # Conversation defaults
    system_prompt: str | None = _setting(None, "System prompt; empty uses resources/system_prompt.txt.",
                                         group="Conversation")
    tools_enabled: bool = _setting(True, "Put the tool-schema block into the shared prefix.",
                                   group="Conversation")
    temperature: float = _setting(0.7, "Sampling temperature (0 is greedy).", group="Sampling",
                                  low=0.0, high=5.0)
    top_p: float = _setting(0.95, "Nucleus sampling.", group="Sampling", low=0.0, high=1.0)
    top_k: int = _setting(40, "Top-k sampling (0 off).", group="Sampling", low=0, high=1000)
    min_p: float = _setting(0.05, "Min-p sampling.", group="Sampling", low=0.0, high=1.0)
    repeat_penalty: float = _setting(1.1, "Repetition penalty (1 off).", group="Sampling",
                                     low=0.5, high=3.0)
    max_tokens: int = _setting(1024, "Longest reply in tokens.", group="Sampling", low=1, high=65536)
    seed: int = _setting(-1, "Sampling seed (-1 random).", group="Sampling", low=-1, high=2**31 - 1)

    # Persistence and keep-alive
    ttl_short_s: int = _setting(int(DEFAULT_TTL_SECONDS["short"]), "Lifetime of a 'short' KV file.",
                                group="Persistence", low=10, high=30 * 86400)
    ttl_long_s: int = _setting(int(DEFAULT_TTL_SECONDS["long"]), "Lifetime of a 'long' KV file.",
                               group="Persistence", low=10, high=30 * 86400)
    ttl_extended_s: int = _setting(int(DEFAULT_TTL_SECONDS["extended"]),
                                   "Lifetime of an 'extended' KV file (pinned conversations).",
                                   group="Persistence", low=10, high=365 * 86400)
    disk_budget_bytes: int = _setting(4 << 30, "KV disk cap: saved KV files (of every model) past it are deleted, "
                                      "least recently used first, on each write and in the eviction sweep; a "
                                      "conversation whose file went is rebuilt from its history when reopened.",
                                      group="Persistence", low=0, high=1 << 44)
    disk_reserve_bytes: int = _setting(64 << 20, "Free disk space kept for the chat history: neither the K/V "
                                       "spill nor the KV files write into it.", group="Persistence", applies=RELOAD,
                                       low=0, high=1 << 40)
    kv_file_bits: int = _setting(16, "Bits per K/V value in the KV files written from now on: 16 keeps llama.cpp's "
                                 "f16 bytes; 8 packs the slot's cells and the saved blocks as the 8-bit pool does, to "
                                 "about 0.51x the disk. Measured on SmolLM2-135M: the same reply after reopening, the "
                                 "recovery-fidelity test passes; but an 8-bit file's blocks are near, not exact, so a "
                                 "closed conversation's file no longer lends its blocks to chunk reuse (an attachment "
                                 "seen there is decoded again).", group="Persistence", choices=KV_FILE_BITS)
    keepalive_interval_s: int = _setting(240, "Keep-alive sweep interval.", group="Persistence",
                                         low=5, high=86400)
    eviction_interval_s: int = _setting(300, "Eviction sweep interval.", group="Persistence",
                                        low=5, high=86400)
    model_idle_unload_s: int = _setting(1800, "Unload the model after this idle time (0 = never).",
                                        group="Persistence", low=0, high=7 * 86400)

    # Local OpenAI-compatible endpoint
    server_enabled: bool = _setting(False, "Serve the OpenAI-compatible endpoint while the app runs.",
                                    group="Endpoint")
    server_host: str = _setting("127.0.0.1", "Address the endpoint listens on (loopback; others only "
                                "with `serve --allow-remote`).", group="Endpoint")
    server_port: int = _setting(8765, "Port of the endpoint (0 picks a free one).", group="Endpoint", low=0,
                                high=65535)
    api_key: str = _setting("", "Bearer key the endpoint requires (empty: none).", group="Endpoint")
    server_max_request_bytes: int = _setting(8 << 20, "Largest request body the endpoint reads; a larger one is "
                                             "refused (413) before any of it is tokenized.", group="Endpoint",
                                             low=64 << 10, high=1 << 30)

    # Window
    theme: str = _setting("auto", "Window colours: auto follows the desktop's light or dark scheme (and its "
                          "changes); dark or light keeps one.", group="Window", choices=THEMES)
    text_size: int = _setting(100, "Text size of the chat in percent: messages, code, the message box and the "
                              "conversation list (Ctrl+Plus, Ctrl+Minus, Ctrl+0 in the window).", group="Window",
                              low=50, high=300)

    home: str | None = field(default=None, metadata={
        "description": "Root for data, cache and config (tests); empty uses platformdirs.",
        "group": "Internal", "applies": RELOAD, "low": None, "high": None, "choices": None})

    def __post_init__(self) -> None:
        self.validate()

    # -- validation ---------------------------------------------------------------------------
    def validate(self) -> None:
        """ValueError naming each field that fails its declaration, else the first failing cross check."""
        problems = field_problems({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        if problems:
            raise ValueError("; ".join(f"{name}={value!r}: {reason}" for name, (value, reason) in problems.items()))
        for _, check in CROSS_FIELD_CHECKS:
            check(self)

    @classmethod
    def describe(cls) -> list[dict[str, Any]]:
        """One dict per setting (name, default, description, group, applies, low, high, choices)."""
        return [{"name": f.name, "default": f.default, "type": f.type, **f.metadata}
                for f in dataclasses.fields(cls) if f.metadata.get("group") != "Internal"]

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    def changed(self, other: Settings) -> list[str]:
        """Names of the settings whose values differ from `other`."""
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) != getattr(other, f.name)]

    def with_now_of(self, new: Settings) -> Settings:
        """These settings with `new`'s values of the settings that apply now (the rest waits for a reload)."""
        return dataclasses.replace(self, **{f.name: getattr(new, f.name) for f in dataclasses.fields(self)
                                            if f.metadata.get("applies") == NOW})

    def ttl_seconds(self) -> dict[str, int]:
        """Lifetime of each KV file TTL class (`KVFileStore`'s `ttl_seconds`)."""
        return {cls: getattr(self, name) for name, cls in TTL_SETTINGS.items()}

    def needs_reload(self, other: Settings) -> list[str]:
        """Names of settings that differ from `other` and apply only after a model reload."""
        return [f.name for f in dataclasses.fields(self)
                if f.metadata.get("applies") == RELOAD and getattr(self, f.name) != getattr(other, f.name)]

    # -- directories --------------------------------------------------------------------------
    def _root(self, kind: str) -> Path:
        home = self.home or os.environ.get("EVOKE_HOME")
        path = Path(home) / kind if home else Path(getattr(platformdirs, f"user_{kind}_dir")(APP_NAME))
        return private_mkdir(path)

    @property
    def data_dir(self) -> Path:
        return self._root("data")

    @property
    def cache_dir(self) -> Path:
        return self._root("cache")

    @property
    def config_dir(self) -> Path:
        return self._root("config")

    # -- persistence --------------------------------------------------------------------------
    def save(self, path: Path | None = None) -> Path:
        path = path or self.config_dir / "settings.json"
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "home"}
        private_write_text(path, json.dumps(values, indent=2, sort_keys=True))
        return path

    @classmethod
    def load(cls, path: Path | None = None, **overrides: Any) -> Settings:
        """The saved settings (see `load_checked`), each problem with the file logged as a warning."""
        settings, problems = cls.load_checked(path, **overrides)
        for problem in problems:
            log.warning("%s", problem.text)
        return settings

    @classmethod
    def load_checked(cls, path: Path | None = None, **overrides: Any) -> tuple[Settings, list[SettingProblem]]:
        """The settings saved in `path` (default: settings.json in the config folder) with `overrides` on top, and
        what was wrong with the file: a bad value keeps its default, every other saved value is kept. Invalid
        `overrides` (the caller's own values) raise ValueError."""
        base = cls(**overrides) if "home" in overrides else cls()
        path = path or (Path(overrides["home"]) / "config" / "settings.json" if "home" in overrides
                        else base.config_dir / "settings.json")
        saved, problems = _read_saved(path)
        known = {f.name for f in dataclasses.fields(cls)} - {"home"}
        for key in [key for key in saved if key not in known]:
            log.warning("ignoring unknown setting %r in %s", key, path)
            saved.pop(key)
        for name, (value, reason) in field_problems(saved).items():
            problems.append(SettingProblem(path, (name,), reason, value))
            saved.pop(name)
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        for names, check in CROSS_FIELD_CHECKS:
            try:
                check(SimpleNamespace(**{**defaults, **saved}))
            except ValueError as exc:
                problems.append(SettingProblem(path, tuple(n for n in names if n in saved), str(exc),
                                               tuple(saved.get(n) for n in names if n in saved)))
                for name in names:
                    saved.pop(name, None)
        return cls(**{**saved, **overrides}), problems


@dataclass(frozen=True)
class SettingProblem:
    """A saved value that was not used: `names` (the settings; empty: the whole file) kept their defaults."""

    path: Path
    names: tuple[str, ...]
    reason: str
    value: Any = None

    @property
    def detail(self) -> str:
        """What was not used and why, without the file."""
        if not self.names:
            return f"the file {self.reason}; every setting uses its default"
        defaults = ", ".join(f"{name} = {_json(getattr(Settings, name))}" for name in self.names)
        value = _json(self.value) if len(self.names) == 1 else ", ".join(map(_json, self.value))
        return f"{', '.join(self.names)} = {value} is not used ({self.reason}); using the default {defaults}"

    @property
    def text(self) -> str:
        return f"settings file {self.path}: {self.detail}"


def _json(value: Any) -> str:
    """A saved value as it appears in settings.json."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _read_saved(path: Path) -> tuple[dict[str, Any], list[SettingProblem]]:
    """The JSON object saved in `path` ({} when there is none) and why it could not be read, if it could not."""
    if not path.exists():
        return {}, []
    private_file(path)                                   # written before files were private
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return {}, [SettingProblem(path, (), f"could not be read ({exc})")]
    if not isinstance(values, dict):
        return {}, [SettingProblem(path, (), f"holds a JSON {type(values).__name__}, not an object")]
    return values, []


# -- the checks, derived from the declarations above ----------------------------------------------
_REASONS = {"int_type": "not a whole number", "float_type": "not a number", "bool_type": "not true or false",
            "string_type": "not text", "none_required": "must be null"}


@functools.cache
def field_model() -> type[BaseModel]:
    """The pydantic model of every setting, built from the dataclass fields: the declared type (strict: no
    float or bool passes for an integer, no text for a number), `low`/`high` as bounds, `choices` as a Literal."""
    hints = get_type_hints(Settings)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(Settings):
        meta = f.metadata
        kind: Any = hints[f.name]
        if meta.get("choices"):
            kind = Literal[meta["choices"]] if f.default is not None else Literal[meta["choices"]] | None
        fields[f.name] = (kind, Field(f.default, ge=meta.get("low"), le=meta.get("high")))
    return create_model("SettingsFields", __config__=ConfigDict(strict=True), **fields)


def field_problems(values: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """{name: (value, why it is refused)} for each of `values` that its declaration refuses."""
    try:
        field_model().model_validate(values)
    except ValidationError as exc:
        problems: dict[str, tuple[Any, str]] = {}
        for error in exc.errors():
            name = str(error["loc"][0])
            if name not in problems:
                problems[name] = (values.get(name), _reason(name, error))
        return problems
    return {}


def _reason(name: str, error: Any) -> str:
    meta = next(f.metadata for f in dataclasses.fields(Settings) if f.name == name)
    if error["type"] == "literal_error":
        return f"choose one of {', '.join(map(str, meta['choices']))}"
    if error["type"] in ("greater_than_equal", "less_than_equal"):
        return f"must lie in [{meta['low']}, {meta['high']}]"
    return _REASONS.get(error["type"], str(error["msg"]))


def _check_watermarks(settings: Any) -> None:
    if settings.low_watermark >= settings.high_watermark:
        raise ValueError(f"low_watermark ({settings.low_watermark}) must be below "
                         f"high_watermark ({settings.high_watermark})")


def _check_rpc(settings: Any) -> None:
    check_rpc_settings(settings.rpc_servers, settings.rpc_layer_split)


# Checks across fields: (the fields a failure resets to their defaults when loading, the check).
CROSS_FIELD_CHECKS: tuple[tuple[tuple[str, ...], Callable[[Any], None]], ...] = (
    (("low_watermark", "high_watermark"), _check_watermarks),
    (("rpc_servers", "rpc_layer_split"), _check_rpc),
)
