"""`bench batch-ceiling` on the real embedded model, tiny sizes: both layouts measured, one client and N at once,
each figure a positive time and a ratio of the two rates (no timing is asserted)."""

from benchmarks.batch_ceiling import run


def test_both_layouts_report_one_and_many_and_their_ratio():
    out = run(threads=2, clients=2, prompt=4, reply=3, trials=1)
    for layout in ("streams", "unified"):
        figures = out[layout]
        assert figures["one"]["total_s"] > 0 and figures["at_once"]["total_s"] > 0
        assert figures["ratio"] == round(figures["at_once"]["tokens_per_s"] / figures["one"]["tokens_per_s"], 2)
