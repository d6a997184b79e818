"""A conversation's KV state as bytes: block table, template history and every block's K/V.

Invariants: a payload is self-describing (JSON head with a format number, then the blobs it
indexes); decoding never trusts a length it has not checked against the payload; the store's
header (model hash, checksum) has already been verified before `decode_payload` runs.
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass, field

import numpy as np

from .blocks import Block, BlockState

FORMAT = 1
Buffer = bytes | bytearray | memoryview


class SnapshotError(ValueError):
    """The payload is not a conversation snapshot this version can read."""


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
            "turn": snapshot.turn, "budget_tokens": snapshot.budget_tokens, "history": snapshot.history,
            "blocks": [_block_head(b) for b in snapshot.blocks], "spans": spans, "counters": snapshot.counters,
            "focus": snapshot.focus}
    head_bytes = json.dumps(head, separators=(",", ":")).encode()
    return struct.pack("<I", len(head_bytes)) + head_bytes + b"".join(blobs)


def decode_payload(payload: bytes | bytearray) -> Snapshot:
    """Blobs come back as memoryviews into `payload` (no copy; writable when it is a bytearray)."""
    try:
        (head_len,) = struct.unpack_from("<I", payload, 0)
        if 4 + head_len > len(payload):
            raise SnapshotError("head longer than the payload")
        head = json.loads(bytes(payload[4:4 + head_len]))
        if head.get("format") != FORMAT:
            raise SnapshotError(f"snapshot format {head.get('format')} (this version reads {FORMAT})")
        body = memoryview(payload)[4 + head_len:]

        def blob(key: str) -> tuple[memoryview, int, int] | None:
            if key not in head["spans"]:
                return None
            offset, length, origin, n_tokens = head["spans"][key]
            if offset < 0 or length < 0 or offset + length > len(body):
                raise SnapshotError(f"blob {key} outside the payload")
            return body[offset:offset + length], origin, n_tokens

        blocks = []
        for row in head["blocks"]:
            block = Block(name=row["name"], role=row["role"], turn=row["turn"], tokens=list(row["tokens"]),
                          text=row["text"], state=BlockState(row["state"]), shared=row["shared"],
                          pinned=row["pinned"], priority=row["priority"], file_name=row["file_name"],
                          hash=row["hash"], recoveries=row["recoveries"], pos=row.get("pos"))
            if row.get("embedding"):
                vector = np.frombuffer(base64.b64decode(row["embedding"]), dtype=np.float16).astype(np.float32)
                block.embedding = vector / (np.linalg.norm(vector) + 1e-12)
            blocks.append(block)
        saved = {}
        for index in range(len(blocks)):
            found = blob(str(index))
            if found is not None:
                saved[index] = found
        return Snapshot(conversation_id=head["conversation_id"], prefix_key=head["prefix_key"], turn=head["turn"],
                        budget_tokens=head["budget_tokens"], history=head["history"], blocks=blocks,
                        image=blob("image"), saved=saved, counters=head.get("counters", {}),
                        focus=head.get("focus"))
    except SnapshotError:
        raise
    except (struct.error, ValueError, KeyError, TypeError, base64.binascii.Error) as exc:
        raise SnapshotError(f"unreadable snapshot: {exc}") from exc
