"""`bench gloss-idle` on the real embedded model, two turns and a short think time: the writer's totals, the idle
seconds it slept, each turn's queue time."""

from __future__ import annotations

import pytest

from benchmarks.gloss_idle import run


@pytest.mark.slow
def test_the_bench_reports_the_writers_cost_share_and_each_turns_wait():
    out = run(turns=2, think_s=0.2)
    assert out["turns"] == 2 and out["idle_s"] >= 0.6                 # the think times, and the last drain
    assert len(out["turns_detail"]) == 2 and all("queued_ms" in row for row in out["turns_detail"])
    writer = out["writer"]
    assert writer["runs"] >= 1 and writer["wall_s"] >= writer["model_s"] >= 0
    assert out["idle_share"] == pytest.approx(writer["wall_s"] / out["idle_s"], abs=0.02)
