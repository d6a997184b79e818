"""KV files hold 8- and 4-bit saved blocks as the pool does (issue 28): a conversation persisted with `pool_bits` 8
or 4 reopens from its file with those blocks still packed and brings them back into context; a file whose packed
bytes do not fit (a scale, a shape) is rejected whole and the conversation rebuilt from its history."""

from __future__ import annotations

import struct

import pytest

from evoke_engine import Engine, Settings
from evoke_engine.kvcache import kvquant
from evoke_engine.memory.snapshot import decode_payload, encode_payload

DOC = "\n".join(f"Entry {i}: the cache at node {i} holds {i * 3} pages of {['red', 'blue', 'green'][i % 3]} data."
                for i in range(60))


def _settings(tmp_path, bits: int) -> Settings:
    return Settings(home=str(tmp_path), budget_tokens=512, block_tokens=128, n_ctx=4096, slots=2, pool_bits=bits)


def _persisted(engine: Engine) -> str:
    """A conversation whose attached file was partly evicted, released to its KV file; its id."""
    conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
    conv.send("Read this.", [("doc.txt", DOC)], max_tokens=8, temperature=0)
    conv.send("Which colour is node 4?", max_tokens=8, temperature=0)
    assert conv.stats().evictions > 0
    conv.check()
    engine.release_conversation(conv.id)
    return conv.id


def _events(engine: Engine) -> list[str]:
    kinds: list[str] = []
    engine.subscribe(lambda event: kinds.append(event.kind))
    return kinds


@pytest.mark.parametrize("bits", [8, 4])
def test_a_kv_file_keeps_packed_blocks_packed_and_reopens_from_them(tmp_path, bits):
    with Engine(_settings(tmp_path, bits), scheduler=False, prewarm=False) as engine:
        conversation_id = _persisted(engine)
        snapshot = decode_payload(engine.kvfiles.read(conversation_id))
        assert snapshot.saved and all(kvquant.bits_of(data) == bits for data, _, _ in snapshot.saved.values())
        assert kvquant.bits_of(snapshot.image[0]) is None                 # the resident cells stay exact
    with Engine(_settings(tmp_path, 16), scheduler=False, prewarm=False) as engine:   # another bits setting
        kinds = _events(engine)
        conv = engine.open_conversation(conversation_id)
        assert "kv_restored" in kinds and "kv_rebuilt" not in kinds
        saved = [b for b in conv.stats().blocks if b["state"] in ("ram", "disk")]
        assert saved
        held = engine.diagnostics().pool.ram_bytes
        assert held < (0.55 if bits == 8 else 0.35) * sum(b["tokens"] for b in saved) * 23_000
        text = next(b["text"] for b in conv.blocks(with_text=True) if b["name"] == saved[0]["name"])
        line = next(line for line in text.splitlines() if line.startswith("Entry"))
        reply = conv.send(f"About this line: {line} What does it say?", max_tokens=16, temperature=0)
        conv.check()
        back = next(b for b in conv.stats().blocks if b["name"] == saved[0]["name"])
        assert reply.strip() and back["state"] == "resident" and conv.stats().recoveries > 0


def _damage_first_packed(payload: bytes, how: str) -> bytes:
    snapshot = decode_payload(bytearray(payload))
    index, (data, origin, n_tokens) = next(iter(snapshot.saved.items()))
    data = bytearray(data)
    _, _, count = kvquant._HEAD.unpack_from(data, 0)
    table_end = kvquant._HEAD.size + count * kvquant._REGION.size
    if how == "scale":                      # the last tensor's first step NaN (its codes end the blob)
        last = kvquant.Region(*kvquant._REGION.unpack_from(data, kvquant._HEAD.size + (count - 1)
                                                           * kvquant._REGION.size))
        step_at = len(data) - last.code_bytes(kvquant.bits_of(data)) - 2 * last.n_scales
        data[step_at:step_at + 2] = b"\xff\x7f"
    elif how == "shape":                     # the first tensor claims one row more
        (rows,) = struct.unpack_from("<I", data, kvquant._HEAD.size + 8)
        struct.pack_into("<I", data, kvquant._HEAD.size + 8, rows + 1)
    else:
        del data[table_end + 10:table_end + 14]
    snapshot.saved[index] = (bytes(data), origin, n_tokens)
    return encode_payload(snapshot)


@pytest.mark.parametrize("how", ["scale", "shape", "truncated"])
def test_a_damaged_packed_block_rejects_the_whole_file_and_the_history_rebuilds_it(tmp_path, how):
    with Engine(_settings(tmp_path, 8), scheduler=False, prewarm=False) as engine:
        conversation_id = _persisted(engine)
        payload = bytes(engine.kvfiles.read(conversation_id))
        engine.kvfiles.write(conversation_id, "long", _damage_first_packed(payload, how))   # a valid store header
        kinds = _events(engine)
        reasons: list[str] = []
        engine.subscribe(lambda event: reasons.append(str(event.as_dict())) if event.kind == "kv_rebuilt" else None)
        conv = engine.open_conversation(conversation_id)
        conv.check()
        assert "kv_rebuilt" in kinds and "kv_restored" not in kinds
        assert any("packed" in reason for reason in reasons), reasons
        assert conv.send("Which node holds 9 pages?", max_tokens=8, temperature=0).strip()
        conv.check()
