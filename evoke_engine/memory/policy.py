"""Eviction and recovery decisions over a block table: which blocks leave, which come back.

Invariants: pure logic over plain objects (no llama.cpp); never selects a protected block
(shared prefix, sink, pinned, current reply, recent tail); recovery never plans more tokens
than the room it is given.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..kvcache.blocks import Block, BlockTable


def protected_blocks(table: BlockTable, *, tail_tokens: int, current: Iterable[Block] = ()) -> set[Block]:
    """Resident blocks that must stay: prefix, sink, pinned, current, recent tail."""
    keep = set(current)
    if table.blocks:
        keep.add(table.blocks[0])                           # the sink
    active = table.active_tokens
    for block in table.resident:
        if block.shared or block.pinned or block.end > active - tail_tokens:
            keep.add(block)
    return keep


def choose_victims(table: BlockTable, *, target_tokens: int, protected: set[Block],
                   score: Callable[[Block], float]) -> list[Block]:
    """Lowest-scored evictable blocks until active tokens would be <= target (older first on ties)."""
    excess = table.active_tokens - target_tokens
    if excess <= 0:
        return []
    candidates = [b for b in table.resident if b not in protected]
    candidates.sort(key=lambda b: (score(b), b.pos))
    victims, freed = [], 0
    for block in candidates:
        if freed >= excess:
            break
        victims.append(block)
        freed += block.n_tokens
    return victims


@dataclass(frozen=True)
class RecoveryPick:
    block: Block
    reason: str           # "identity" | "named" | "similar"
    similarity: float


def named_in(message: str, block: Block) -> bool:
    """True when the message names the block's file (`config.py`, `src/config.py`)."""
    if not block.file_name:
        return False
    base = block.file_name.rsplit("/", 1)[-1]
    return base in message and _name_pattern(base).search(message) is not None     # the plain test first: cheap


@functools.lru_cache(maxsize=1024)
def _name_pattern(base: str) -> re.Pattern:
    """`base` as a whole file name (not part of a longer name or path segment)."""
    return re.compile(rf"(?<![\w.-]){re.escape(base)}(?![\w-])")


def file_neighbours(hits: Sequence[Block], blocks: Sequence[Block], *, available: Callable[[Block], bool],
                    limit: int) -> list[Block]:
    """The blocks next to each file block of `hits` (best first) in its own file, before and after it in `blocks`
    (birth order), that are `available` and not hits themselves: at most `limit`, the best hit's first. A question
    that meets a file's header or its neighbouring keys then brings back the block holding the value too (a YAML
    file's `ingest:` section split across two blocks)."""
    by_file: dict[str, list[Block]] = {}
    for block in blocks:
        if block.file_name:
            by_file.setdefault(block.file_name, []).append(block)
    chosen = set(hits)
    extra: list[Block] = []
    for hit in hits:
        siblings = by_file.get(hit.file_name or "", [])
        if hit not in siblings:
            continue
        at = siblings.index(hit)
        for near in (siblings[at - 1] if at > 0 else None, siblings[at + 1] if at + 1 < len(siblings) else None):
            if len(extra) >= limit:
                return extra
            if near is not None and near not in chosen and available(near):
                chosen.add(near)
                extra.append(near)
    return extra


def choose_recoveries(saved: list[Block], *, message: str, similarity: Callable[[Block], float],
                      resident_best: dict[str, float], top_k: int, room_tokens: int,
                      identity_hashes: set[str] = frozenset(),
                      tie_break: Callable[[Block], float] | None = None,
                      margin: float | None = None,
                      eligible: Callable[[Block], bool] | None = None) -> list[RecoveryPick]:
    """Identity hits and named blocks first, then similarity top-K past the resident gate.
    Equal similarities go to the higher `tie_break` (a saved block's last-known attention).

    The gate compares like with like: a saved block comes back only if it is more similar to
    the message than every resident block of its role (`resident_best[role]`). Measured here:
    against all roles, the user's own earlier wording ("read this document") outranks the
    document chunk that holds the answer, and the gate then blocks every useful recovery.

    With `margin` (adaptive width) the gate is instead: a saved block comes back when its score is within
    `margin` of the best score of any block, saved or resident (`resident_best` over every role), so one block
    comes back when the top is clearly ahead and several when the scores are close; still at most `top_k`.
    `eligible` (a wide recovery's working set) limits the similarity picks further; identity and named hits stay.
    """
    picks: list[RecoveryPick] = []
    for block in saved:
        if block.hash in identity_hashes:
            picks.append(RecoveryPick(block, "identity", similarity(block)))
        elif named_in(message, block):
            picks.append(RecoveryPick(block, "named", similarity(block)))
    chosen = {p.block for p in picks}
    tie = tie_break or (lambda _block: 0.0)
    ranked = sorted((b for b in saved if b not in chosen and (eligible is None or eligible(b))),
                    key=lambda b: (similarity(b), tie(b)), reverse=True)
    best = max([similarity(b) for b in ranked[:1]] + list(resident_best.values()), default=-1.0)
    for block in ranked[:top_k]:
        sim = similarity(block)
        if margin is not None and margin >= 0:
            passes = sim >= best - margin
        else:
            passes = sim > resident_best.get(block.role, -1.0)
        if passes:
            picks.append(RecoveryPick(block, "similar", sim))
    picks.sort(key=lambda p: ({"identity": 0, "named": 1, "similar": 2}[p.reason], -p.similarity, -tie(p.block)))
    planned, used = [], 0
    for pick in picks:
        if used + pick.block.n_tokens <= room_tokens:
            planned.append(pick)
            used += pick.block.n_tokens
    return planned
