"""Chunk-reuse helpers for the unit tier: a block's copy (the same file attached elsewhere) and a prefill that
splices each block the index has and decodes the rest, checked against the simulated cache's cells."""

from __future__ import annotations

from evoke_engine.kvcache.blocks import Block
from evoke_engine.memory.memory import ConversationMemory

from .rig import Rig


def copy_of(block: Block) -> Block:
    """The same tokens as `block`, a new block (the same file attached in another conversation)."""
    return Block(name=block.name, role=block.role, turn=block.turn, tokens=list(block.tokens), text=block.text)


def attach(rig: Rig, memory: ConversationMemory, blocks: list[Block]) -> list[dict]:
    """A turn's prefill: each block reused when the index has it, else decoded."""
    hits = []
    for block in blocks:
        hit = memory.append_reused(block)
        if hit is None:
            memory.append_decoded(block)
        else:
            hits.append(hit)
    memory.report_reuse(hits)
    memory.check()
    assert rig.kv.layout(memory.seq) == rig.expected_layout(memory)     # the cells hold the right tokens
    return hits
