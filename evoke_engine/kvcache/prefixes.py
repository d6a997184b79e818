"""The shared prefixes: a system prompt with its tool schemas, decoded once into a prefix sequence.

Invariants: a prefix's key is the hash of its tokens; its cells are decoded once and only ever shared
into slots (never shifted or evicted); a slot with a context of its own gets a copy of the prefix's
bytes instead (kept in host RAM, spliced without a decode); when every prefix sequence is taken the
least recently used goes (an owner's before a public one).
A prefix is shared only within its scope (issue 57 item 3: a guessed system prompt must not be confirmed by
how fast it answers): the public scope holds the prewarmed ones (the configured default prompt and tool schema,
asked for with no owner, and the default prompt without tools: `declare_public`); every other prefix belongs to
the owner that asked for it (the endpoint's client, the window), and another owner sending the same text decodes
its own.
The first user message's opening is decoded with the prefix, kept as bytes and spliced (held ahead)
into a slot that holds the prefix alone, so a first message decodes only its own tokens.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from ..package_files import resources_root
from ..runtime.kv import KVCache, SavedKV
from ..runtime.runtime import Runtime
from ..runtime.template import ChatTemplate
from ..settings import Settings
from .blocks import Block

log = logging.getLogger(__name__)


def default_system_prompt() -> str:
    return (resources_root() / "system_prompt.txt").read_text(encoding="utf-8").strip()


def default_tools() -> list[dict]:
    return json.loads((resources_root() / "tools.json").read_text(encoding="utf-8"))


def system_prompt_of(settings: Settings) -> str:
    """The system prompt a new conversation gets: the setting, else the built-in one."""
    return settings.system_prompt if settings.system_prompt is not None else default_system_prompt()


def tools_of(settings: Settings) -> list[dict]:
    """The tool schemas a new conversation gets (none when tools are off)."""
    return default_tools() if settings.tools_enabled else []


def system_message(system_prompt: str, tools: list[dict]) -> dict:
    """The template message that opens every conversation: the system prompt with the tool schemas."""
    return {"role": "system", "content": system_prompt + tools_text(tools)}


def tools_text(tools: list[dict]) -> str:
    if not tools:
        return ""
    lines = ["", "", "# Tools", "You can call these read-only tools; answer with a JSON object "
             '{"name": ..., "arguments": {...}} to call one.']
    lines += [json.dumps(tool["function"], separators=(",", ":")) for tool in tools]
    return "\n".join(lines)


PUBLIC = ""             # the scope of the prewarmed prefixes (the configured default prompt and tools): anyone's


def prefix_key(tokens: list[int]) -> str:
    return "pfx:" + hashlib.sha256(np.asarray(tokens, dtype=np.int32).tobytes()).hexdigest()[:16]


@dataclass
class Prefix:
    key: str
    seq: int
    tokens: list[int]
    pieces: list[tuple[str, str, list[int]]]     # (block name, text, tokens): system, tools
    opening: list[int] = field(default_factory=list)     # a first user message's opening (`<|im_start|>user\n`)
    opening_kv: SavedKV | None = None                    # its K/V, decoded after the prefix
    kv: SavedKV | None = None                            # the prefix's own K/V, for slots in other contexts
    decoded_at: float = field(default_factory=time.monotonic)   # when its cells were decoded (usage's cached tokens)
    scope: str = PUBLIC                                  # who may share it: PUBLIC, or the owner it was decoded for

    def blocks(self) -> list[Block]:
        """The conversation's first blocks: one per piece, their cells shared with the prefix sequence."""
        return [Block(name=name, role=name, turn=0, tokens=list(tokens), text=text, shared=True)
                for name, text, tokens in self.pieces]


class SharedPrefixes:
    """Prefix sequences keyed by token hash, decoded on first use (engine thread)."""

    def __init__(self, runtime: Runtime, kv: KVCache, template: ChatTemplate) -> None:
        self.rt, self.kv, self.template = runtime, kv, template
        self.seqs = list(runtime.prefix_seqs)
        self._by_key: OrderedDict[tuple[str, str], Prefix] = OrderedDict()    # (scope, key) -> prefix
        self._key_by_content: dict[tuple[str, str], str] = {}   # (scope, system message content) -> key
        self._public: set[str] = set()         # contents asked for with no owner (prewarmed): shared by everyone

    def declare_public(self, system_prompt: str, tools: list[dict]) -> None:
        """Make this system prompt and tools public (decoded on first use, then shared by everyone): the configured
        default prompt as the endpoint sends it to a request with no system message and no tools."""
        self._public.add(system_prompt + tools_text(tools))

    def scope_of(self, content: str, owner: str | None) -> str:
        """Who shares the prefix of this system message content asked for by `owner`: everyone (PUBLIC) for a
        prewarmed one (asked for with no owner, now or before), else that owner alone."""
        return PUBLIC if owner is None or content in self._public else f"owner:{owner}"

    def for_conversation(self, system_prompt: str, tools: list[dict], owner: str | None = None) -> Prefix:
        """The prefix of a conversation of `owner` with this system prompt and tools, decoded now if that owner
        holds none (nor the public scope: no owner is the prewarm's, which makes the content public)."""
        extra = tools_text(tools)
        content = system_prompt + extra                 # the system message's content (`system_message`)
        if owner is None:
            self._public.add(content)
        scope = self.scope_of(content, owner)
        known = self._by_key.get((scope, self._key_by_content.get((scope, content), "")))
        if known is not None:                   # every open and slot change asks: skip render and tokenize
            self._by_key.move_to_end((scope, known.key))
            return known
        segment = self.template.segment([], system_message(system_prompt, tools))
        split = segment.find(extra) if extra else -1
        texts = [("system", segment)] if split < 0 else [("system", segment[:split]), ("tools", segment[split:])]
        texts = [(name, text) for name, text in texts if text]
        pieces = [(name, text, self.rt.tokenize(text, add_special=(i == 0))) for i, (name, text) in enumerate(texts)]
        tokens = [t for _, _, toks in pieces for t in toks]
        key = prefix_key(tokens)
        self._key_by_content[(scope, content)] = key
        prefix = self._by_key.get((scope, key))
        if prefix is not None:
            self._by_key.move_to_end((scope, key))
            return prefix
        seq, displaced = self._free_seq()
        self.kv.drop(seq)
        prefix = Prefix(key=key, seq=seq, tokens=tokens, pieces=pieces, scope=scope)
        if tokens:
            opening_text = self.template.user_opening([system_message(system_prompt, tools)])
            prefix.opening = self.rt.tokenize(opening_text) if opening_text else []
            self.rt.decode([*tokens, *prefix.opening], seq, 0, logits_last=False)
            if not self.rt.slots_share_cells:           # each slot gets the prefix as bytes
                prefix.kv = self.kv.save(seq, 0, len(tokens))
            if prefix.opening:
                prefix.opening_kv = self.kv.save(seq, len(tokens), len(tokens) + len(prefix.opening))
                self.kv.drop(seq, len(tokens), -1)
        self._by_key[(scope, key)] = prefix
        if displaced is not None:
            log.info("prefix %s displaced by %s", displaced.key, key)
            self._key_by_content = {c: k for c, k in self._key_by_content.items() if (c[0], k) in self._by_key}
        return prefix

    def decoded_at(self, system_prompt: str, tools: list[dict], owner: str | None = None) -> float | None:
        """When the prefix `owner` gets for this system prompt and tools was decoded (`time.monotonic`), None when it
        is not held; any thread (dict reads)."""
        content = system_prompt + tools_text(tools)
        scope = self.scope_of(content, owner)
        prefix = self._by_key.get((scope, self._key_by_content.get((scope, content), "")))
        return None if prefix is None else prefix.decoded_at

    def share_into(self, prefix: Prefix, seq: int) -> None:
        """Give sequence `seq` the prefix's cells (no decode; no copy within the prefix's context)."""
        if not prefix.tokens:
            return
        if prefix.kv is None or self.kv.same_cells(prefix.seq, seq):
            self.kv.share(prefix.seq, seq, 0, len(prefix.tokens))
        else:                                        # at its own positions: restore leaves the bytes as they are
            self.kv.restore(prefix.kv, seq, prefix.kv.origin_pos)

    def hold_opening(self, prefix: Prefix, seq: int) -> None:
        """Splice the first user message's opening after the prefix in `seq` (which must hold the prefix
        and nothing after it) and hold it ahead: its K/V were computed on the same cells at the same
        positions, so the first message claims them instead of decoding them (a miss drops them)."""
        saved = prefix.opening_kv
        if saved is None:
            return
        at = len(prefix.tokens)
        self.kv.restore(SavedKV(data=bytearray(saved.data), origin_pos=saved.origin_pos, n_tokens=saved.n_tokens),
                        seq, at)
        self.kv.hold_ahead(seq, at, prefix.opening, opening=len(prefix.opening))

    def _free_seq(self) -> tuple[int, Prefix | None]:
        """A sequence for a new prefix, and the prefix it displaces (if any): the least recently used of an owner,
        else the least recently used public one (owners' prefixes never push the prewarmed ones out while an owner's
        can go)."""
        used = {p.seq for p in self._by_key.values()}
        for seq in self.seqs:
            if seq not in used:
                return seq, None
        victim = next((k for k, p in self._by_key.items() if p.scope != PUBLIC), next(iter(self._by_key)))
        oldest = self._by_key.pop(victim)
        return oldest.seq, oldest

    def all(self) -> list[Prefix]:
        return list(self._by_key.values())

    def clear(self) -> None:
        self._by_key.clear()
        self._key_by_content.clear()
