"""A ConversationMemory over the fake KV cache: settings, pool and a shared prefix, as the engine builds them.

Owns nothing of the engine: it wires `FakeRuntime`, `FakeKVCache` and a real `SavedPool` (on a tmp dir)
into real `ConversationMemory` objects the way lifecycle.py and prefixes.py do (the prefix decoded once
into its own sequence, shared into each slot, its blocks first in the table and `shared`). Settings have
the embedder off, so no torch loads and scores come from recency, priority, floors and pins only.
Every block of `tokens_for` is one toy word per token, tagged so a test can read back which block a
cell came from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evoke_engine.events import EngineEvent
from evoke_engine.kvcache.blocks import Block
from evoke_engine.kvcache.chunk_index import ChunkIndex
from evoke_engine.kvcache.pool import SavedPool
from evoke_engine.memory.embedder import Embedder
from evoke_engine.memory.memory import ConversationMemory
from evoke_engine.settings import Settings

from .fake_kv import FakeKVCache, FakeRuntime

SMALL = {"budget_tokens": 200, "block_tokens": 16, "tail_fraction": 0.15, "high_watermark": 0.92,
         "low_watermark": 0.70, "embedder": "off", "slots": 4}
PREFIX = (("system", 10), ("tools", 6))


class Rig:
    def __init__(self, tmp_path: Path, *, prefix: tuple[tuple[str, int], ...] = PREFIX, n_cells: int = 1 << 16,
                 **settings: Any) -> None:
        self.settings = Settings(home=str(tmp_path / "home"), **{**SMALL, **settings})
        self.rt = FakeRuntime(slots=self.settings.slots, n_cells=n_cells)
        self.kv = FakeKVCache(self.rt)
        self.pool = SavedPool(self.settings.ram_budget_bytes, tmp_path / "spill")
        self.embedder = Embedder("off")
        self.events: list[EngineEvent] = []
        self.prefix_seq = self.settings.slots
        self.prefix = [(name, self.tokens_for(n, name)) for name, n in prefix]
        at = 0
        for _, tokens in self.prefix:                       # decoded once, shared into every slot
            self.rt.decode(tokens, self.prefix_seq, at, logits_last=False)
            at += len(tokens)
        self.prefix_tokens = at
        self._serial = 0

    def tokens_for(self, n: int, tag: str) -> list[int]:
        tokens = self.rt.tokenize(self.rt.vocab.words(n, tag.replace("#", "_") + "."), parse_special=False)
        assert len(tokens) == n
        return tokens

    def memory(self, conversation_id: str = "c", seq: int = 0, *, chunks: ChunkIndex | None = None,
               settings: Settings | None = None) -> ConversationMemory:
        """A fresh conversation in slot `seq`, holding only the shared prefix (lifecycle's create); `chunks`: the
        chunk index it shares with other conversations (none by default)."""
        memory = ConversationMemory(conversation_id, settings=settings or self.settings, runtime=self.rt,
                                    kv=self.kv, pool=self.pool, embedder=self.embedder, emit=self.events.append,
                                    chunks=chunks)
        memory.sequence.adopt_prefix(Block(name=name, role=name, turn=0, tokens=list(tokens), text="", shared=True)
                                     for name, tokens in self.prefix)
        self.share_prefix(seq)
        memory.unpark(seq)
        return memory

    def share_prefix(self, seq: int) -> None:
        """Empty slot `seq` and share the prefix cells into it (no decode)."""
        self.kv.drop(seq)
        if self.prefix_tokens:
            self.kv.share(self.prefix_seq, seq, 0, self.prefix_tokens)

    def enter_slot(self, memory: ConversationMemory, seq: int) -> None:
        """A parked conversation back into slot `seq` (lifecycle's ensure_slot)."""
        self.share_prefix(seq)
        memory.unpark(seq)

    def block(self, role: str, n: int, *, turn: int = 1, name: str | None = None, **fields: Any) -> Block:
        self._serial += 1
        name = name or f"{role}#{turn}.{self._serial}"
        tokens = self.tokens_for(n, name)
        return Block(name=name, role=role, turn=turn, tokens=tokens, text=self.rt.detokenize(tokens), **fields)

    def add(self, memory: ConversationMemory, role: str, n: int, *, current: list[Block] = (),
            **fields: Any) -> Block:
        """Decode a new block at the tail (making room first), as a turn's prefill does."""
        block = self.block(role, n, **fields)
        memory.append_decoded(block, current=current)
        return block

    def expected_layout(self, memory: ConversationMemory) -> list[tuple[int, int]]:
        """(position, token) the slot must hold: the resident blocks' tokens at their table positions."""
        return [(b.pos + i, t) for b in memory.table.resident for i, t in enumerate(b.tokens)]

    def close(self) -> None:
        self.pool.close()
