"""The shared step over KV streams (issue 59): with a stream per slot, the waiting replies' tokens go through one
decode even where a slot between them has no token waiting (llama.cpp takes streams into one ubatch only as a run of
consecutive seq ids: a filler token joins the gap and leaves it again), and each reply's row is the logits it gets
decoded alone, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from evoke_engine.runtime.kv import KVCache
from evoke_engine.runtime.runtime import Runtime
from evoke_engine.runtime.step_batch import StepToken
from evoke_engine.settings import Settings

TEXTS = ["The river runs past the mill and", "Tea is grown on the hills where", "A compiler turns source code into"]


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    rt = Runtime(Settings(n_ctx=3072, slots=3, home=str(tmp_path_factory.mktemp("steps"))))
    if rt.layout != "streams":
        rt.close()
        pytest.skip(f"no KV stream per slot here: {rt.layout_note}")
    kv = KVCache(rt)
    yield rt, kv
    rt.close()


class Rows:
    """A stand-in sampler: keeps the logits row the shared step hands it."""

    def __init__(self, rt: Runtime) -> None:
        self.rt, self.row = rt, None

    def presample(self, row: int) -> None:
        self.row = self.rt.logits(row)


@pytest.mark.parametrize("fill_gaps", [True, False], ids=["a filler in the gap", "a ubatch a run"])
def test_slots_around_one_without_a_token_share_one_decode_and_get_their_own_logits(rig, fill_gaps):
    rt, kv = rig
    rt.step_batch.fill_gaps = fill_gaps
    prompts = [rt.tokenize(text) for text in TEXTS]
    alone = []
    for seq in (0, 2):
        kv.drop(seq)
        rt.decode(prompts[seq], seq, 0, logits_last=False)
        rt.decode([prompts[seq][-1]], seq, len(prompts[seq]))
        alone.append(rt.logits())
    kv.drop(1)
    rt.decode(prompts[1], 1, 0, logits_last=False)                # the slot between them: cells, no token waiting
    middle_end = kv.pos_max(1)
    for seq in (0, 2):
        kv.drop(seq, len(prompts[seq]), -1)
    batch = rt.step_batch
    samplers = {seq: Rows(rt) for seq in (0, 2)}
    batch.samplers.update(samplers)
    try:
        steps, filled = batch.steps, batch.filled
        for seq in (2, 0):
            batch.add(StepToken(seq, prompts[seq][-1], len(prompts[seq])))
        rt.run_step()
    finally:
        for seq in samplers:
            batch.samplers.pop(seq, None)
    assert batch.steps == steps + 1 and batch.filled == filled + int(fill_gaps)   # one decode, the gap filled or not
    assert kv.pos_max(1) == middle_end                                 # and the filler gone again
    assert np.array_equal(samplers[0].row, alone[0]) and np.array_equal(samplers[2].row, alone[1])
