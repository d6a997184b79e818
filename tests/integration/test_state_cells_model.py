"""Cutting a range out of a slot image on the real embedded model: `state_cells.cut(image, p0, p1)` is byte for
byte what `KVCache.save(seq, p0, p1)` returns, for an f16 cache with V stored transposed (flash attention off) and
as rows (on), and for a q8_0 cache; after eviction the image's cells are not in position order and it still holds."""

from __future__ import annotations

import pytest

from evoke_engine.kvcache.state_cells import UnfitState, cut, layout
from evoke_engine.runtime.kv import KVCache
from evoke_engine.runtime.runtime import Runtime
from evoke_engine.settings import Settings

TEXT = " ".join(f"Row {i}: the loader reads column {i} and keeps the value {i * 17 % 89} for later."
                for i in range(30))


@pytest.fixture(scope="module", params=[("f16", "off"), ("f16", "on"), ("q8_0", "on")],
                ids=["f16-v-transposed", "f16-flash", "q8_0-flash"])
def rig(request, tmp_path_factory):
    cache_type, flash = request.param
    rt = Runtime(Settings(n_ctx=2048, slots=2, kv_cache_type=cache_type, flash_attention=flash,
                          home=str(tmp_path_factory.mktemp("cells"))))
    kv = KVCache(rt)
    yield rt, kv, flash
    rt.close()


def test_a_cut_of_the_image_is_the_save_of_that_range(rig):
    rt, kv, flash = rig
    tokens = rt.tokenize(TEXT)[:300]
    kv.drop(0)
    rt.decode(tokens, 0, 0, logits_last=False)
    image = kv.save(0, 20, 300).data                     # a slot image: the cells after a 20-token "prefix"
    assert layout(image).v_trans == (flash == "off")
    for p0, p1 in [(20, 300), (20, 148), (148, 276), (276, 300), (100, 101)]:
        assert cut(image, p0, p1) == kv.save(0, p0, p1).data, (p0, p1)
    with pytest.raises(UnfitState):
        cut(image, 10, 30)                               # not held whole: nothing comes back
    kv.drop(0)


def test_cells_out_of_position_order_cut_alike(rig):
    rt, kv, _ = rig
    tokens = rt.tokenize(TEXT)[:200]
    kv.drop(0)
    rt.decode(tokens[:120], 0, 0, logits_last=False)
    kv.evict(0, 30, 60)                                  # a hole in the cells, then later tokens fill it
    kv.flush_pending_shifts()
    rt.decode(tokens[120:200], 0, 90, logits_last=False)
    image = kv.save(0, 0, 170).data
    positions = list(layout(image).positions)
    assert positions != sorted(positions)                # the cut must keep the cell order, not sort it
    for p0, p1 in [(0, 170), (80, 130), (95, 170)]:
        assert cut(image, p0, p1) == kv.save(0, p0, p1).data, (p0, p1)
    kv.drop(0)
