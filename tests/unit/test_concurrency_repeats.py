"""`bench concurrency --repeats`: several runs of a scenario become one figure each, on plain dicts (no server).
Numbers by their median, a flag true only if every run had it, nested figures key by key, lists kept as run."""

from benchmarks.concurrency import median_of, repeated


def test_numbers_take_the_median_and_flags_every_run():
    runs = [{"ratio": 2.0, "ok": True, "times": [0.1]}, {"ratio": 1.0, "ok": False, "times": [0.2]},
            {"ratio": 1.5, "ok": True, "times": [0.3]}]
    assert median_of(runs) == {"ratio": 1.5, "ok": False, "times": [[0.1], [0.2], [0.3]]}


def test_nested_figures_and_missing_ratios():
    runs = [{"n4": {"aggregate_vs_one": 1.2}, "gap": None}, {"n4": {"aggregate_vs_one": 1.4}, "gap": 3.0}]
    assert median_of(runs) == {"n4": {"aggregate_vs_one": 1.3}, "gap": [None, 3.0]}


def test_one_run_is_reported_as_it_came_and_several_keep_their_samples():
    assert repeated(lambda run: {"ratio": 1.0, "run": run}, 1) == {"ratio": 1.0, "run": 0}
    values = iter([1.0, 3.0, 2.0])
    figure = repeated(lambda run: {"ratio": next(values), "run": run}, 3)
    assert figure["ratio"] == 2.0 and [s["ratio"] for s in figure["samples"]] == [1.0, 3.0, 2.0]
    assert [s["run"] for s in figure["samples"]] == [0, 1, 2]          # each run is told which it is (its prompts)


def test_each_run_asks_its_own_prompts():
    from benchmarks.concurrency import FUNCTIONS, TOPICS, capital_question
    assert len({capital_question(run, which) for run in range(3) for which in (0, 1)}) == 6
    per_run = 1 + 2 + 4                                  # alone, then 2 and 4 at once
    assert per_run * 3 <= len(TOPICS) and len(FUNCTIONS) >= 3
