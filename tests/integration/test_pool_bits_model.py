"""8- and 4-bit host pool on the real embedded model: a block holding a passkey, evicted into the pool packed and
spliced back, continues with the same greedy tokens as at 16 bits, for about a half and a third of the bytes."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.pool import _needle_block, passkey_document, splice_round_trip
from evoke_engine.kvcache import kvquant
from evoke_engine.kvcache.blocks import Block
from evoke_engine.kvcache.pool import SavedPool
from evoke_engine.runtime import reanchor
from evoke_engine.runtime.kv import KVCache
from evoke_engine.runtime.runtime import Runtime
from evoke_engine.settings import Settings


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    rt = Runtime(Settings(n_ctx=4096, slots=2, home=str(tmp_path_factory.mktemp("poolbits"))))
    yield rt, KVCache(rt)
    rt.close()


@pytest.mark.parametrize("seed", [0, 3])
def test_a_packed_block_spliced_back_continues_like_a_16_bit_one_for_a_fraction_of_the_bytes(rig, tmp_path, seed):
    rt, kv = rig
    text, key = passkey_document(seed)
    tokens = rt.tokenize(text)
    p0, p1 = _needle_block(rt, tokens, key)
    runs = {}
    for bits in (16, 8, 4):
        pool = SavedPool(1 << 30, tmp_path / str(bits), bits=bits)
        runs[bits] = splice_round_trip(rt, kv, pool, tokens, p0, p1)
        assert pool.ram_bytes == 0
        pool.close()
    logits16, greedy16, bytes16, _ = runs[16]
    assert key in rt.detokenize(greedy16).replace(" ", "")
    for bits, (low, high) in {8: (0.5, 0.53), 4: (0.3, 0.33)}.items():
        logits, greedy, held, _ = runs[bits]
        assert greedy == greedy16, bits
        assert np.argmax(logits) == np.argmax(logits16)
        assert np.abs(logits - logits16).max() < 2.0
        assert low < held / bytes16 < high


def test_a_real_blob_is_walked_whole_and_its_k_rows_are_where_the_reanchor_parse_finds_them(rig):
    rt, kv = rig
    kv.drop(0)
    rt.decode(rt.tokenize(passkey_document(1)[0]), 0, 0, logits_last=False)
    blob = kv.save(0, 5, 40).data
    found = kvquant.regions(blob)
    assert found is not None and found[-1].offset + found[-1].nbytes == len(blob)
    if kv.geometry is not None:
        assert tuple(r.offset for r in found[:len(found) // 2]) == reanchor.parse(blob, kv.geometry).k_offsets
    assert kvquant.regions(kvquant.unpack(kvquant.pack(blob))) == found
    assert kvquant.regions(kvquant.unpack(kvquant.pack(blob, 4))) == found
    kv.drop(0)


def test_a_q8_0_cache_is_held_as_it_is(tmp_path):
    rt = Runtime(Settings(n_ctx=1024, slots=2, home=str(tmp_path), kv_cache_type="q8_0"))
    try:
        kv = KVCache(rt)
        rt.decode(rt.tokenize("The pool keeps a q8_0 cache's bytes exactly as llama.cpp wrote them."), 0, 0)
        saved = kv.save(0, 2, 10)
        assert kvquant.pack(saved.data) is None
        pool = SavedPool(1 << 30, tmp_path / "spill", bits=8)
        block = Block(name="b", role="file", turn=1, tokens=[1] * 8, text="b")
        original = bytes(saved.data)
        pool.put(block, saved)
        assert pool.ram_bytes == len(original) and bytes(pool.take(block).data) == original
        pool.close()
    finally:
        rt.close()
