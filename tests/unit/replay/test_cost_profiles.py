"""benchmarks/cost_profiles.py: the H100 roofline grows with rows and context and is labelled as
a roofline, profiles survive a save/load round trip (the committed file is what the code
writes), the measured fit ignores a lone slow step."""

import pytest

from benchmarks import cost_profiles as cp
from benchmarks.target_shapes import LLADA_8B, LLAMA_8B

ROWS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096]


@pytest.mark.parametrize("shape", [LLAMA_8B, LLADA_8B], ids=lambda s: s.name)
def test_roofline_monotone_in_rows_and_context(shape):
    cost = cp.Roofline(shape, cp.H100_SXM)
    times = [cost.seconds(r, 8, 1024) for r in ROWS]
    assert all(b >= a for a, b in zip(times, times[1:]))
    assert times[-1] > 2 * times[0]  # compute-bound at thousands of rows
    by_context = [cost.seconds(64, 8, c) for c in (0, 512, 4096, 32768)]
    assert all(b > a for a, b in zip(by_context, by_context[1:]))
    # one row: reading the weights once at the published bandwidth, plus the overhead
    floor = shape.matmul_params * 2 / cp.H100_SXM["hbm_bytes_per_s"] + cost.overhead_s
    assert cost.seconds(1, 1, 0) == pytest.approx(floor, rel=0.01)


def test_roofline_profile_round_trip_and_committed_file(tmp_path):
    prof = cp.h100_roofline()
    assert prof.label.startswith(cp.ROOFLINE_LABEL)
    back = cp.load_profile(cp.save_profile(prof, tmp_path / "p.json"))
    assert back.to_dict() == prof.to_dict()
    for name, cost in prof.targets.items():
        assert back.targets[name].seconds(100, 4, 300) == cost.seconds(100, 4, 300)
    committed = cp.load_profile("h100-roofline")
    assert committed.to_dict() == prof.to_dict(), "run python -m benchmarks.cost_profiles"
    assert committed.target_for("dllm")[0] == "llada-8b"
    assert committed.target_for("ar")[0] == "llama-8b"


def test_measured_fit_monotone_robust_and_round_trip(tmp_path):
    steps = [{"rows": r, "drafting": True, "clean": True, "seconds": 0.001 * r}
             for r in (10, 10, 11, 40, 41, 80, 160) for _ in range(3)]
    steps.append({"rows": 11, "drafting": True, "clean": True, "seconds": 5.0})  # a GC pause
    steps.append({"rows": 999, "drafting": True, "clean": False, "seconds": 0.0})
    fit = cp.fit_measured(steps)
    assert not fit.plain and max(r for r, _ in fit.drafting) == 160
    times = [fit.seconds(r) for r in (1, 10, 20, 40, 80, 160, 320)]
    assert all(b >= a for a, b in zip(times, times[1:]))
    assert fit.seconds(80) == pytest.approx(0.08, rel=0.05)  # the slow step is outvoted
    assert fit.seconds(4, drafting=False) == fit.seconds(4)  # no plain step: borrowed
    prof = cp.Profile("m", "measured", "MEASURED: test", {"x": fit})
    back = cp.load_profile(cp.save_profile(prof, tmp_path / "m.json"))
    assert back.targets["x"].seconds(55) == pytest.approx(fit.seconds(55))


def test_unknown_kind_refused():
    with pytest.raises(ValueError, match="kind"):
        cp.profile_from_dict({"name": "x", "kind": "guess", "label": "", "targets": {}})
