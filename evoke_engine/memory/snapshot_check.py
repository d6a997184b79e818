"""The structure of a snapshot head, checked as a whole before any of it is used: format (and migration of
older ones), types and ranges, the block table and the byte spans, plus the llama.cpp cell records in a blob.

Invariants: these functions only read; a head `check_head` accepts decodes into Blocks without an exception;
every failure is one SnapshotError whose message is the reason (it becomes the `kv_rebuilt` event text).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
import struct
from typing import Any

import numpy as np

from ..kvcache.blocks import BlockState, content_hash
from ..settings import Settings

FORMAT = 5               # 5: the head holds the blocks' line vectors ("line_vectors"); older files compute them
                         #    after the turn that first needs them
                         # 4: a saved block's bytes may be kvquant's 8- or 4-bit packed form (the pool's)
                         # 3: the image may end with the next message's opening ("ahead", its tokens)
                         # 2: the head names the embedder of its vectors ("embedder")
MAX_AHEAD = 64           # tokens of a message's opening held ahead (a template's role header is a few)
OLDEST_FORMAT = 1        # 1: no "embedder"; migrated by treating its vectors as of an unknown embedder
ROLES = frozenset({"system", "tools", "user", "assistant", "file", "breadcrumb"})
STATES = frozenset(state.value for state in BlockState)
SAVED_STATES = frozenset({BlockState.RAM.value, BlockState.DISK.value})
MAX_POS = 2**31 - 1      # llama_pos is int32


class SnapshotError(ValueError):
    """The payload is not a conversation snapshot this version can use; the message says why."""


def _budget_range() -> tuple[int, int]:
    meta = next(f.metadata for f in dataclasses.fields(Settings) if f.name == "budget_tokens")
    return int(meta["low"]), int(meta["high"])


BUDGET_LOW, BUDGET_HIGH = _budget_range()


def need(condition: bool, reason: str) -> None:
    if not condition:
        raise SnapshotError(reason)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def migrate_head(head: Any) -> dict:
    """The head in the current format, or SnapshotError for a format this version cannot read."""
    need(isinstance(head, dict), "the head is not a JSON object")
    version = head.get("format")
    need(is_int(version) and OLDEST_FORMAT <= version <= FORMAT,
         f"snapshot format {version!r} (this version reads {OLDEST_FORMAT} to {FORMAT})")
    if version == 1:
        head = {**head, "format": 2, "embedder": None}
    if head["format"] == 2:
        head = {**head, "format": 3, "ahead": []}
    if head["format"] == 3:
        head = {**head, "format": 4}                  # nothing to change: format 3 files hold f16 bytes only
    if head["format"] == 4:
        head = {**head, "format": 5, "line_vectors": {}}
    return head


def vector_of(text: Any, what: str) -> np.ndarray:
    """A unit float32 vector from the base64 float16 bytes the encoder writes."""
    need(isinstance(text, str), f"{what} is not base64 text")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SnapshotError(f"{what} is not base64 ({exc})") from exc
    need(len(raw) >= 2 and len(raw) % 2 == 0, f"{what} holds {len(raw)} bytes, not float16 values")
    vector = np.frombuffer(raw, dtype=np.float16).astype(np.float32)
    norm = float(np.linalg.norm(vector))
    need(bool(np.isfinite(vector).all()) and norm > 0, f"{what} is not a finite non-zero vector")
    return vector / norm


def focus_of(value: Any) -> np.ndarray | None:
    if value is None:
        return None
    need(isinstance(value, list) and value and all(is_number(x) for x in value),
         "focus is not a list of finite numbers")
    vector = np.asarray(value, dtype=np.float32)
    need(bool(np.isfinite(vector).all()) and float(np.linalg.norm(vector)) > 0, "focus is a zero vector")
    return vector


def _check_row(index: int, row: Any) -> None:
    what = f"block {index}"
    need(isinstance(row, dict), f"{what} is not an object")
    need(isinstance(row.get("name"), str) and row["name"] != "", f"{what} has no name")
    what = f"block {index} ({row['name'][:40]})"
    need(row.get("role") in ROLES, f"{what}: role {row.get('role')!r} is not one of {sorted(ROLES)}")
    need(row.get("state") in STATES, f"{what}: state {row.get('state')!r} is not one of {sorted(STATES)}")
    need(is_int(row.get("turn")) and row["turn"] >= 0, f"{what}: turn is not a count")
    tokens = row.get("tokens")
    need(isinstance(tokens, list) and tokens and all(is_int(t) and 0 <= t < 2**31 for t in tokens),
         f"{what}: tokens are not a list of token ids")
    need(isinstance(row.get("text"), str), f"{what}: text is not a string")
    need(isinstance(row.get("shared"), bool) and isinstance(row.get("pinned"), bool),
         f"{what}: shared/pinned are not booleans")
    need(is_number(row.get("priority")) and row["priority"] >= 0, f"{what}: priority is not a number >= 0")
    need(row.get("file_name") is None or isinstance(row["file_name"], str), f"{what}: file_name is not a string")
    need(row.get("hash") == content_hash(tokens), f"{what}: hash does not match its tokens")
    need(is_int(row.get("recoveries")) and row["recoveries"] >= 0, f"{what}: recoveries is not a count")
    pos = row.get("pos")
    if row["state"] == BlockState.RESIDENT.value:
        need(is_int(pos) and 0 <= pos <= MAX_POS, f"{what}: resident without a position")
    else:
        need(pos is None, f"{what}: {row['state']} but has a position")
        need(not row["shared"], f"{what}: a shared block left the context")
    if row.get("embedding"):
        vector_of(row["embedding"], f"{what}: embedding")


def _check_table(rows: list[dict]) -> tuple[int, int]:
    """Resident blocks contiguous from 0, shared ones first. Returns (shared tokens, own resident tokens)."""
    resident = sorted((r for r in rows if r["state"] == BlockState.RESIDENT.value), key=lambda r: r["pos"])
    at, shared, own = 0, 0, 0
    for row in resident:
        need(row["pos"] == at, f"block {row['name'][:40]} at position {row['pos']}, expected {at} "
                               "(resident blocks must be contiguous)")
        at += len(row["tokens"])
        if row["shared"]:
            need(own == 0, f"shared block {row['name'][:40]} after the conversation's own blocks")
            shared += len(row["tokens"])
        else:
            own += len(row["tokens"])
    need(at <= MAX_POS, "resident tokens overflow a position")
    return shared, own


def _check_spans(spans: Any, rows: list[dict], body_len: int, shared: int, own: int, ahead: int) -> None:
    need(isinstance(spans, dict), "spans is not an object")
    ranges = []
    for key, span in spans.items():
        need(isinstance(span, list) and len(span) == 4 and all(is_int(x) for x in span),
             f"span {key!r} is not [offset, length, origin, tokens]")
        offset, length, origin, n_tokens = span
        need(offset >= 0 and length > 0 and offset + length <= body_len,
             f"span {key!r} [{offset}, +{length}) lies outside the {body_len}-byte area")
        need(n_tokens > 0 and 0 <= origin <= MAX_POS - n_tokens, f"span {key!r}: origin or token count out of range")
        if key == "image":
            need(n_tokens == own + ahead and origin == shared,
                 f"image span holds {n_tokens} tokens at {origin}, the table {own} (+ {ahead} ahead) at {shared}")
        else:
            need(key.isdigit() and str(int(key)) == key and int(key) < len(rows), f"span key {key!r} names no block")
            row = rows[int(key)]
            need(row["state"] in SAVED_STATES, f"span {key} for block {row['name'][:40]} in state {row['state']}")
            need(n_tokens == len(row["tokens"]),
                 f"span {key} holds {n_tokens} tokens, block {row['name'][:40]} has {len(row['tokens'])}")
        ranges.append((offset, offset + length, key))
    need(("image" in spans) == (own > 0), f"{own} resident tokens of its own but "
                                          f"{'an' if 'image' in spans else 'no'} image span")
    ranges.sort()
    for (_, end, key), (start, _, other) in zip(ranges, ranges[1:], strict=False):
        need(end <= start, f"spans {key!r} and {other!r} overlap")


def check_head(head: dict, body_len: int) -> None:
    """Every field of a (migrated) head, the block table and the spans, against a body of `body_len` bytes."""
    need(isinstance(head.get("conversation_id"), str) and head["conversation_id"] != "",
         "conversation_id is not a string")
    need(isinstance(head.get("prefix_key"), str), "prefix_key is not a string")
    need(is_int(head.get("turn")) and head["turn"] >= 0, "turn is not a count")
    budget = head.get("budget_tokens")
    need(is_int(budget) and BUDGET_LOW <= budget <= BUDGET_HIGH,
         f"budget_tokens {budget!r} is not an integer in [{BUDGET_LOW}, {BUDGET_HIGH}]")
    own_budget = head.get("own_budget")
    need(own_budget is None or is_int(own_budget) and BUDGET_LOW <= own_budget <= BUDGET_HIGH,
         f"own_budget {own_budget!r} is neither absent nor an integer in [{BUDGET_LOW}, {BUDGET_HIGH}]")
    history = head.get("history")
    need(isinstance(history, list), "history is not a list")
    for i, message in enumerate(history):
        need(isinstance(message, dict) and isinstance(message.get("role"), str)
             and isinstance(message.get("content"), str), f"history entry {i} is not a role/content message")
    need(head.get("embedder") is None or isinstance(head["embedder"], str), "embedder is not a string")
    counters = head.get("counters", {})
    need(isinstance(counters, dict) and all(is_int(v) and v >= 0 for v in counters.values()),
         "counters are not counts")
    focus_of(head.get("focus"))
    rows = head.get("blocks")
    need(isinstance(rows, list), "blocks is not a list")
    for index, row in enumerate(rows):
        _check_row(index, row)
    shared, own = _check_table(rows)
    need(shared < budget, f"budget_tokens {budget} is not larger than the shared prefix ({shared} tokens)")
    ahead = head.get("ahead")
    need(isinstance(ahead, list) and len(ahead) <= MAX_AHEAD and all(is_int(t) and t >= 0 for t in ahead),
         f"ahead is not a list of at most {MAX_AHEAD} token ids")
    need(own > 0 or not ahead, "tokens held ahead of a conversation with no tokens of its own")
    opening = head.get("ahead_opening", 0)
    need(is_int(opening) and 0 <= opening <= len(ahead), "ahead_opening is not a count of the tokens held ahead")
    _check_spans(head.get("spans"), rows, body_len, shared, own, len(ahead))
    if "chunks" in head:
        _check_chunks(head["chunks"], rows, head["spans"])
    need(isinstance(head.get("exact", False), bool), "exact is not a boolean")
    line_vectors_of(head)


def line_vectors_of(head: dict) -> dict[str, tuple[list[str], np.ndarray]]:
    """The head's line vectors ("line_vectors": line key -> [lines, base64 float16 matrix, one row a line]),
    as float32 matrices; SnapshotError when a record's rows do not match its lines."""
    records = head.get("line_vectors", {})
    need(isinstance(records, dict), "line_vectors is not an object")
    out: dict[str, tuple[list[str], np.ndarray]] = {}
    for key, record in records.items():
        what = f"line vectors of {key[:40]}"
        need(isinstance(record, list) and len(record) == 2 and isinstance(record[0], list)
             and all(isinstance(line, str) for line in record[0]) and isinstance(record[1], str),
             f"{what} are not [lines, vectors]")
        lines = record[0]
        try:
            raw = base64.b64decode(record[1], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise SnapshotError(f"{what} are not base64 ({exc})") from exc
        need(bool(lines) and len(raw) % (2 * len(lines)) == 0, f"{what}: {len(raw)} bytes for {len(lines)} lines")
        matrix = np.frombuffer(raw, dtype=np.float16).astype(np.float32).reshape(len(lines), -1)
        need(bool(np.isfinite(matrix).all()), f"{what} are not finite")
        out[key] = (lines, matrix)
    return out


def own_budget_of(head: dict) -> int | None:
    """The budget set for the conversation alone (optional "own_budget", after `check_head`; absent in files
    written before it was kept: those follow the settings' budget)."""
    return head.get("own_budget")


def chunks_of(head: dict) -> dict[int, tuple[str, int]]:
    """The head's exact blocks (optional "chunks": block index -> [chain key, origin]; absent in files written
    before chunk reuse read KV files, and in older formats), after `check_head`."""
    return {int(index): (key, origin) for index, (key, origin) in head.get("chunks", {}).items()}


def _check_chunks(chunks: Any, rows: list[dict], spans: dict) -> None:
    """Each record names a block by index, a 32-hex chain key and the origin of its bytes: a resident block's
    position (its cells in the image) or its saved span's origin."""
    need(isinstance(chunks, dict), "chunks is not an object")
    for index, record in chunks.items():
        need(isinstance(index, str) and index.isdigit() and str(int(index)) == index and int(index) < len(rows),
             f"chunk {index!r} names no block")
        need(isinstance(record, list) and len(record) == 2 and isinstance(record[0], str) and len(record[0]) == 32
             and all(c in "0123456789abcdef" for c in record[0]) and is_int(record[1]),
             f"chunk {index} is not [chain key, origin]")
        row = rows[int(index)]
        if row["state"] == BlockState.RESIDENT.value:
            need(record[1] == row["pos"], f"chunk {index} at {record[1]}, its block at {row['pos']}")
        else:
            need(index in spans and spans[index][2] == record[1],
                 f"chunk {index}: no saved bytes at origin {record[1]}")


def check_blob(what: str, blob: bytes | bytearray | memoryview, origin: int, n_tokens: int) -> tuple:
    """Walk one sequence's llama.cpp state bytes: one stream of `n_tokens` cells holding origin.., every
    layer's K and V rows, nothing after. Returns the layout signature (equal for blobs of one model)."""
    try:
        magic, version, n_stream, n_cells = struct.unpack_from("<IIII", blob, 0)
        need(n_stream == 1 and n_cells == n_tokens, f"{what}: {n_cells} cells in {n_stream} streams, "
                                                    f"expected {n_tokens} in 1")
        offset = 16
        positions = []
        for _ in range(n_cells):
            pos, n_seq = struct.unpack_from("<iI", blob, offset)
            need(n_seq == 1, f"{what}: a cell of {n_seq} sequences")
            positions.append(pos)
            offset += 12
        need(sorted(positions) == list(range(origin, origin + n_cells)),       # cell order is not position order
             f"{what}: cells do not hold positions {origin}..{origin + n_cells - 1} once each")
        v_trans, n_layer = struct.unpack_from("<II", blob, offset)
        offset += 8
        need(v_trans in (0, 1) and 0 < n_layer <= 1024, f"{what}: {n_layer} layers")
        rows = []
        for _ in range(n_layer):
            k_type, k_row = struct.unpack_from("<iQ", blob, offset)
            offset += 12 + n_cells * k_row
            rows.append((k_type, k_row))
        for _ in range(n_layer):
            if v_trans:
                v_type, v_size, v_embd = struct.unpack_from("<iII", blob, offset)
                offset += 12 + n_cells * v_size * v_embd
                rows.append((v_type, v_size, v_embd))
            else:
                v_type, v_row = struct.unpack_from("<iQ", blob, offset)
                offset += 12 + n_cells * v_row
                rows.append((v_type, v_row))
    except struct.error as exc:
        raise SnapshotError(f"{what}: truncated K/V bytes ({exc})") from exc
    need(offset == len(blob), f"{what}: {len(blob)} bytes, its cells account for {offset}")
    return magic, version, v_trans, n_layer, tuple(rows)
