"""KV files at 8 bits (issue 41, item 11, `kv_file_bits`): the slot image and saved blocks are packed in the pool's
8-bit format, the file takes about half the disk, and the conversation reopens from it (no rebuild) and gives the
same reply as from a 16-bit file."""

from __future__ import annotations

from evoke_engine import Engine, Settings
from evoke_engine.kvcache import kvquant
from evoke_engine.memory.snapshot import decode_payload

DOC = "\n".join(f"Line {i}: the service at port {8000 + i} restarts nightly." for i in range(24))
TURNS = [("Read this file.", [("services.txt", DOC)]), ("Which port does line 3 use?", [])]
NEXT = "And which port does line 7 use?"


def _persist_and_reopen(home, bits: int) -> dict:
    settings = Settings(home=str(home), budget_tokens=256, block_tokens=64, n_ctx=2048, slots=1, n_threads=2,
                        embedder="off", kv_file_bits=bits)
    with Engine(settings, scheduler=False, prewarm=False) as engine:
        conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
        for text, attachments in TURNS:
            conv.send(text, attachments, max_tokens=8, temperature=0)
        assert conv.stats().evictions > 0
        engine.release_conversation(conv.id)
        snapshot = decode_payload(engine.kvfiles.read(conv.id, refresh=False))
        out = {"bytes": engine.kvfiles.total_bytes(), "image_bits": kvquant.bits_of(snapshot.image[0]),
               "saved_bits": {kvquant.bits_of(data) for data, _, _ in snapshot.saved.values()},
               "exact": snapshot.exact}
        kinds: list[str] = []
        engine.subscribe(lambda event: kinds.append(event.kind))
        reopened = engine.open_conversation(conv.id)
        reopened.check()
        out.update(restored="kv_restored" in kinds and "kv_rebuilt" not in kinds,
                   reply=reopened.send(NEXT, max_tokens=12, temperature=0))
        return out


def test_an_8_bit_kv_file_takes_half_the_disk_and_reopens_to_the_same_reply(tmp_path):
    full = _persist_and_reopen(tmp_path / "16", 16)
    packed = _persist_and_reopen(tmp_path / "8", 8)
    assert full["image_bits"] is None and full["saved_bits"] == {None}
    assert packed["image_bits"] == 8 and packed["saved_bits"] == {8} and not packed["exact"]
    assert packed["bytes"] < 0.56 * full["bytes"]
    assert full["restored"] and packed["restored"]
    assert packed["reply"] == full["reply"]
