"""Helpers of the snapshot fuzzer: a conversation's real payload split into head and body, mutations that
know its structure (fields, types, table entries, spans, cell records), and cloning its SQLite history."""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import struct
import uuid

import numpy as np
from hypothesis import strategies as st

WEIRD = [None, True, False, -1, 0, 1, 7, 2**40, 1.5, -0.5, float("nan"), float("inf"), "", "x", "12",
         [], [1], [[0, 1, 2, 3]], {}, {"a": 1}]


def split(payload: bytes) -> tuple[dict, bytes]:
    (head_len,) = struct.unpack_from("<I", payload, 0)
    return json.loads(payload[4:4 + head_len]), bytes(payload[4 + head_len:])


def join(head: dict, body: bytes) -> bytes:
    head_bytes = json.dumps(head, separators=(",", ":")).encode()
    return struct.pack("<I", len(head_bytes)) + head_bytes + body


def clone_conversation(engine, source_id: str, new_id: str | None = None) -> str:
    """A conversation with the same SQLite rows (no KV file), under `new_id` or a fresh id."""
    row = engine.history.get_conversation(source_id)
    new_id = new_id or uuid.uuid4().hex
    engine.history.create_conversation(new_id, "fuzz", row.system_prompt, settings=row.settings)
    for message in engine.history.messages(source_id):
        engine.history.add_message(new_id, message.role, message.text, message.attachments)
    return new_id


def _paths(value, path=()):
    """Paths to every value inside the head (long lists: the list, its first and last element)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*path, key)
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        indices = range(len(value)) if len(value) <= 8 else (0, len(value) - 1)
        for i in indices:
            yield (*path, i)
            yield from _paths(value[i], (*path, i))


def _parent(head, path):
    for key in path[:-1]:
        head = head[key]
    return head


def _vector_text(dim: int, seed: int) -> str:
    vector = np.random.default_rng(seed).standard_normal(dim).astype(np.float16)
    return base64.b64encode(vector.tobytes()).decode()


def _block_op(head, body, data):
    blocks = head["blocks"]
    if not isinstance(blocks, list) or not blocks:
        return head, body
    i = data.draw(st.integers(0, len(blocks) - 1), label="block")
    block = blocks[i]
    op = data.draw(st.sampled_from(["delete", "duplicate", "swap", "state", "pos", "shared", "tokens+",
                                    "tokens-", "role", "embedding-dim", "embedding-junk", "pinned", "text"]),
                   label="block op")
    if op == "delete":
        del blocks[i]
    elif op == "duplicate":
        blocks.insert(i, copy.deepcopy(block))
    elif op == "swap":
        j = data.draw(st.integers(0, len(blocks) - 1))
        blocks[i], blocks[j] = blocks[j], blocks[i]
    elif op == "state":
        block["state"] = data.draw(st.sampled_from(["resident", "ram", "disk", "dropped", "gone"]))
    elif op == "pos":
        block["pos"] = data.draw(st.sampled_from([None, 0, 1, -1, 2**31, (block.get("pos") or 0) + 1]))
    elif op == "shared":
        block["shared"] = not block["shared"]
    elif op == "tokens+":
        block["tokens"] = [*block["tokens"], 42]
    elif op == "tokens-":
        block["tokens"] = block["tokens"][:-1]
    elif op == "role":
        block["role"] = data.draw(st.sampled_from(["tool", "", "USER", 3]))
    elif op == "embedding-dim":
        block["embedding"] = _vector_text(data.draw(st.sampled_from([1, 383, 768])), i)
    elif op == "embedding-junk":
        block["embedding"] = data.draw(st.sampled_from(["!!!", "AAA", [0.1, 0.2], 5, "AAAA"]))
    elif op == "pinned":
        block["pinned"] = not block["pinned"]          # benign: the next turn evicts nothing
    else:
        block["text"] = block["text"] + " (edited)"     # benign: text is not what the model attends to
    return head, body


def _span_op(head, body, data):
    spans = head["spans"]
    keys = sorted(spans)
    if not keys:
        return head, body
    key = data.draw(st.sampled_from(keys), label="span")
    span = spans[key]
    op = data.draw(st.sampled_from(["offset", "length", "origin", "tokens", "other", "delete", "rename",
                                    "add", "cell-pos", "truncate-body"]), label="span op")
    delta = data.draw(st.sampled_from([-17, -1, 1, 12, 1 << 20]), label="delta")
    if op in ("offset", "length", "origin", "tokens"):
        span[["offset", "length", "origin", "tokens"].index(op)] += delta
    elif op == "other":
        other = spans[data.draw(st.sampled_from(keys))]
        span[0], span[1] = other[0], other[1]
    elif op == "delete":
        del spans[key]
    elif op == "rename":
        spans[data.draw(st.sampled_from(["-1", "99", "x", "01", "image", "0"]))] = spans.pop(key)
    elif op == "add":
        spans[str(data.draw(st.integers(0, len(head["blocks"]) - 1)))] = list(span)
    elif op == "cell-pos":
        cell = data.draw(st.integers(0, max(0, span[3] - 1)), label="cell")
        at = span[0] + 16 + 12 * cell
        raw = bytearray(body)
        struct.pack_into("<i", raw, at, struct.unpack_from("<i", raw, at)[0] + delta)
        body = bytes(raw)
    else:
        body = body[:len(body) - data.draw(st.integers(1, 64), label="cut")]
    return head, body


def _history_op(head, body, data):
    history = head["history"]
    if not isinstance(history, list) or not history:
        return head, body
    op = data.draw(st.sampled_from(["delete", "not-dict", "content", "role", "extra", "missing", "swap"]),
                   label="history op")
    i = data.draw(st.integers(0, len(history) - 1), label="entry")
    if op == "delete":
        del history[i]
    elif op == "not-dict":
        history[i] = data.draw(st.sampled_from(WEIRD))
    elif op == "content":
        history[i]["content"] = history[i]["content"] + "!"
    elif op == "role":
        history[i]["role"] = data.draw(st.sampled_from([1, None, "system"]))
    elif op == "extra":
        history[i]["turn"] = 1                          # benign: later versions add keys
    elif op == "missing":
        del head["history"]
    else:
        history.reverse()
    return head, body


def _focus_op(head, body, data):
    head["focus"] = data.draw(st.sampled_from([[0.5] * 768, [0.5], ["a"] * 384, {}, 3, [0.0] * 384,
                                               [float("nan")] * 384, "zz", None]), label="focus")
    return head, body


def _format_op(head, body, data):
    value = data.draw(st.sampled_from([1, 2, 3, 0, 6, "2", None, 2.0]), label="format")
    head["format"] = value
    if value == 1:
        head.pop("embedder", None)                      # a file of format 1: migrated, its vectors dropped
    return head, body


def _field_op(head, body, data):
    path = data.draw(st.sampled_from(list(_paths(head))), label="path")
    op = data.draw(st.sampled_from(["set", "delete", "extra"]), label="field op")
    parent = _parent(head, path)
    if op == "set":
        parent[path[-1]] = data.draw(st.sampled_from(WEIRD), label="value")
    elif op == "delete":
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent["zz_extra"] = 1                          # benign: unknown keys are ignored
    return head, body


OPS = {"field": _field_op, "block": _block_op, "span": _span_op, "history": _history_op,
       "focus": _focus_op, "format": _format_op}


def mutate(payload: bytes, data) -> tuple[bytes, list[str]]:
    head, body = split(payload)
    names = data.draw(st.lists(st.sampled_from(sorted(OPS)), min_size=1, max_size=3), label="ops")
    for name in names:
        # an earlier mutation may have removed what this one edits
        with contextlib.suppress(KeyError, IndexError, TypeError, AttributeError, struct.error):
            head, body = OPS[name](head, body, data)
    return join(head, body), names
