"""A conversation's KV state as bytes: block table, template history and every block's K/V.

Invariants: a payload is self-describing (JSON head with a format number, then the blobs it
indexes); the whole head is checked (`snapshot_check`) before any Block is built, so decoding
either returns a consistent Snapshot or raises SnapshotError; the store's header (model hash,
checksum) has already been verified before `decode_payload` runs.
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass, field

import numpy as np

from ..kvcache.blocks import Block, BlockState
from .glosses import glosses_of
from .snapshot_check import (
    FORMAT,
    SnapshotError,
    check_head,
    chunks_of,
    focus_of,
    line_vectors_of,
    migrate_head,
    own_budget_of,
    vector_of,
)

__all__ = ["FORMAT", "Snapshot", "SnapshotError", "decode_payload", "encode_payload"]
Buffer = bytes | bytearray | memoryview


@dataclass
class Snapshot:
    conversation_id: str
    prefix_key: str
    turn: int
    budget_tokens: int
    history: list[dict]
    blocks: list[Block]
    image: tuple[Buffer, int, int] | None                 # (bytes, origin_pos, n_tokens) of the slot
    saved: dict[int, tuple[Buffer, int, int]] = field(default_factory=dict)  # block index -> bytes
    counters: dict = field(default_factory=dict)
    focus: list[float] | None = None
    embedder: str | None = None          # identity of the embedder that computed the vectors (None: unknown)
    ahead: list[int] = field(default_factory=list)   # the next message's opening: the image's last cells
    ahead_opening: int = 0       # how many of `ahead` are the template's role header (0 in older files: none moves)
    chunks: dict[int, tuple[str, int]] = field(default_factory=dict)   # block index -> (chain key, origin): exact
    exact: bool = False          # every resident cell was what a fresh decode of the resident tokens gives
    lines: dict[str, tuple[list[str], np.ndarray]] = field(default_factory=dict)  # line_key -> lines, vectors
    own_budget: int | None = None    # a budget set for this conversation alone (None: it follows the settings)
    glosses: dict[str, list[list[str]]] = field(default_factory=dict)   # block hash -> [[line, gloss]] (issue 61)


def _block_head(block: Block) -> dict:
    return {"name": block.name, "role": block.role, "turn": block.turn, "tokens": block.tokens,
            "text": block.text, "state": block.state.value, "shared": block.shared, "pinned": block.pinned,
            "priority": block.priority, "file_name": block.file_name, "hash": block.hash,
            "recoveries": block.recoveries, "pos": block.pos,
            "embedding": None if block.embedding is None
            else base64.b64encode(block.embedding.astype(np.float16).tobytes()).decode()}


def encode_payload(snapshot: Snapshot) -> bytes:
    blobs: list[bytes] = []
    spans: dict[str, list[int]] = {}

    def add(key: str, data: bytes, origin: int, n_tokens: int) -> None:
        spans[key] = [sum(len(b) for b in blobs), len(data), origin, n_tokens]
        blobs.append(data)

    if snapshot.image is not None:
        add("image", *snapshot.image)
    for index, saved in snapshot.saved.items():
        add(str(index), *saved)
    head = {"format": FORMAT, "conversation_id": snapshot.conversation_id, "prefix_key": snapshot.prefix_key,
            "turn": snapshot.turn, "budget_tokens": snapshot.budget_tokens, "own_budget": snapshot.own_budget,
            "history": snapshot.history,
            "blocks": [_block_head(b) for b in snapshot.blocks], "spans": spans, "counters": snapshot.counters,
            "focus": snapshot.focus, "embedder": snapshot.embedder, "ahead": snapshot.ahead,
            "ahead_opening": snapshot.ahead_opening,
            "chunks": {str(index): [key, origin] for index, (key, origin) in sorted(snapshot.chunks.items())},
            "exact": snapshot.exact,
            "line_vectors": {key: [lines, base64.b64encode(np.ascontiguousarray(vectors, dtype=np.float16)
                                                           .tobytes()).decode()]
                             for key, (lines, vectors) in snapshot.lines.items()},
            "glosses": snapshot.glosses}
    head_bytes = json.dumps(head, separators=(",", ":")).encode()
    return struct.pack("<I", len(head_bytes)) + head_bytes + b"".join(blobs)


def decode_payload(payload: Buffer) -> Snapshot:
    """Blobs come back as memoryviews into `payload` (no copy; writable when `payload` is).
    Older formats are migrated (`snapshot_check.migrate_head`); anything else wrong is a SnapshotError."""
    try:
        (head_len,) = struct.unpack_from("<I", payload, 0)
        if 4 + head_len > len(payload):
            raise SnapshotError("head longer than the payload")
        head = json.loads(bytes(payload[4:4 + head_len]))
    except (struct.error, ValueError) as exc:        # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise SnapshotError(f"unreadable snapshot head: {exc}") from exc
    head = migrate_head(head)
    body = memoryview(payload)[4 + head_len:]
    check_head(head, len(body))

    def blob(key: str) -> tuple[memoryview, int, int] | None:
        if key not in head["spans"]:
            return None
        offset, length, origin, n_tokens = head["spans"][key]
        return body[offset:offset + length], origin, n_tokens

    blocks = []
    for index, row in enumerate(head["blocks"]):
        block = Block(name=row["name"], role=row["role"], turn=row["turn"], tokens=list(row["tokens"]),
                      text=row["text"], state=BlockState(row["state"]), shared=row["shared"],
                      pinned=row["pinned"], priority=float(row["priority"]), file_name=row.get("file_name"),
                      hash=row["hash"], recoveries=row["recoveries"], pos=row.get("pos"))
        if row.get("embedding"):
            block.embedding = vector_of(row["embedding"], f"block {index} embedding")
        blocks.append(block)
    saved = {}
    for index in range(len(blocks)):
        found = blob(str(index))
        if found is not None:
            saved[index] = found
    focus = focus_of(head.get("focus"))
    return Snapshot(conversation_id=head["conversation_id"], prefix_key=head["prefix_key"], turn=head["turn"],
                    budget_tokens=head["budget_tokens"], history=head["history"], blocks=blocks,
                    image=blob("image"), saved=saved, counters=dict(head.get("counters", {})),
                    focus=None if focus is None else [float(x) for x in focus], embedder=head.get("embedder"),
                    ahead=list(head["ahead"]), ahead_opening=int(head.get("ahead_opening", 0)),
                    chunks=chunks_of(head), exact=head.get("exact", False),
                    lines=line_vectors_of(head), own_budget=own_budget_of(head), glosses=_glosses(head))


def _glosses(head: dict) -> dict[str, list[list[str]]]:
    """The head's model-written glosses (absent in older files: none), checked (`glosses.glosses_of`)."""
    try:
        return glosses_of(head.get("glosses"))
    except ValueError as exc:
        raise SnapshotError(str(exc)) from exc
