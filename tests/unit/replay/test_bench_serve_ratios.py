"""benchmarks/bench_serve.print_ratios: the ratio of medians, and the paired ratio (each run
against the base's run of the same round), which cancels a round's server-instance spread."""

from benchmarks.bench_serve import print_ratios


def run(method, rnd, tput, tpot):
    return {"method": method, "round": rnd, "dataset": "custom", "concurrency": 8,
            "request_rate": "inf", "output_throughput": tput, "mean_tpot_ms": tpot}


def test_paired_ratio_takes_each_round_against_its_own_base(capsys):
    # round 0 is a slow phase for both servers, round 1 a fast one; the method is 0.9x the
    # base inside every round, but its median run lands on the base's fast round
    rows = [run("none", 0, 100.0, 10.0), run("m", 0, 90.0, 11.0),
            run("none", 1, 200.0, 5.0), run("m", 1, 180.0, 5.5),
            run("none", 2, 210.0, 4.8), run("m", 2, 189.0, 5.28)]
    print_ratios(rows)
    line = capsys.readouterr().out.strip()
    assert "median of 3 runs vs none: throughput 0.90x, mean TPOT 1.10x" in line
    assert line.endswith("(paired 0.90x, 1.10x)")
    rows[1]["output_throughput"] = 30.0  # one bad run moves the median only a little
    print_ratios(rows)
    assert "(paired 0.90x, 1.10x)" in capsys.readouterr().out


def test_a_round_without_a_base_run_is_not_paired(capsys):
    print_ratios([run("none", 0, 100.0, 10.0), run("m", 1, 50.0, 20.0)])
    line = capsys.readouterr().out.strip()
    assert "throughput 0.50x" in line and "paired" not in line


def test_modes_run_per_point_and_rotate_with_the_round():
    from benchmarks.bench_serve import _runs
    from benchmarks.load_test import Row

    points = [("custom", 1, "inf"), ("custom", 8, "inf")]
    plugin = Row("target", {"method": "jacobi", "num_speculative_tokens": 8}, {})
    assert _runs(points, plugin, ["auto", "cycle:0"], 0) == [
        (points[0], "auto"), (points[0], "cycle:0"), (points[1], "auto"), (points[1], "cycle:0")]
    assert [m for _, m in _runs(points, plugin, ["auto", "cycle:0"], 1)][:2] == ["cycle:0", "auto"]
    # no speculation and vLLM's own methods have no budget: one run per point, as started
    for row in (Row("target", None, {}), Row("target", {"method": "ngram"}, {})):
        assert _runs(points, row, ["auto", "cycle:0"], 0) == [(p, None) for p in points]
    assert _runs(points, plugin, [], 0) == [(p, None) for p in points]


def test_passes_bracket_each_mode_with_the_other():
    from benchmarks.bench_serve import _runs
    from benchmarks.load_test import Row

    point = ("custom", 8, "inf")
    plugin = Row("target", {"method": "jacobi", "num_speculative_tokens": 8}, {})
    assert [m for _, m in _runs([point], plugin, ["auto", "cycle:0"], 0, passes=4)] == \
        ["auto", "cycle:0", "cycle:0", "auto"] * 2
    assert [m for _, m in _runs([point], plugin, ["auto", "cycle:0"], 1, passes=2)] == \
        ["cycle:0", "auto", "auto", "cycle:0"]
    assert _runs([point], Row("target", None, {}), ["auto"], 0, passes=3) == [(point, None)] * 3
