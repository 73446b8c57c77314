"""The budget's gains checked against the outcomes, position by position
(``core/budget_calibration``, issue 22): an acceptance model that prices deep rows too high
(it leans a seldom-judged position on the one before it) drafted chains of 17-32 in a closed
batch's tail that accepted hardly more than chains of 4."""

import random

import pytest

from vllm_anyorder.core.budget import BudgetController
from vllm_anyorder.core.budget_calibration import Calibration, position_bucket
from vllm_anyorder.core.budget_settings import BudgetSettings


def test_position_buckets_are_exact_then_two_per_doubling():
    assert [position_bucket(j) for j in range(8)] == list(range(8))
    assert position_bucket(8) == position_bucket(10) == 8  # positions 9-11 (1-based)
    assert position_bucket(11) == position_bucket(14) == 9  # 12-15
    assert position_bucket(15) == position_bucket(21) == 10  # 16-22
    assert position_bucket(22) == position_bucket(30) == 11  # 23-31
    assert all(position_bucket(j) <= position_bucket(j + 1) for j in range(200))


def test_without_evidence_gains_pass_unchanged():
    cal = Calibration()
    assert cal.apply([0.9, 0.5, 0.2]) == [0.9, 0.5, 0.2]
    assert cal.apply([0.9, 0.5, 0.0005], floor=1e-3) == [0.9, 0.5]


def test_a_model_too_high_at_depth_is_scaled_to_what_the_rows_accepted():
    """Rows 1-4 accepted as predicted, rows 5-8 predicted 0.3 and never accepted: after a few
    hundred chains, rows 5-8 are priced near what they accept (0) and rows 1-4 near as
    before. Without the scaling the test fails (rows 5-8 stay at 0.3)."""
    rng, cal = random.Random(0), Calibration()
    predicted = [0.8, 0.7, 0.6, 0.5, 0.3, 0.3, 0.3, 0.3]
    for _ in range(600):
        accepted = 0
        while accepted < 4 and rng.random() < [0.8, 0.875, 0.857, 0.833][accepted]:
            accepted += 1
        cal.observe(predicted, accepted)
    scaled = cal.apply(predicted)
    assert scaled[:4] == pytest.approx(predicted[:4], abs=0.06)
    assert max(scaled[4:]) < 0.02


def test_scaled_gains_stay_non_increasing_and_at_most_one():
    cal = Calibration()
    for _ in range(300):  # position 1 accepted always where 0.5 was predicted: scaled up 2x
        cal.observe([0.5, 0.45, 0.4], 3)
    scaled = cal.apply([0.5, 0.45, 0.4])
    assert scaled == sorted(scaled, reverse=True) and max(scaled) <= 1.0


def test_the_controller_checks_its_own_decisions_and_forgets_finished_requests():
    """Through the controller: the gains a decision priced are the ones its outcomes are
    checked against (the evidence is what the acceptance model counts), and a finished
    request's prediction is dropped."""
    c = BudgetController(BudgetSettings(max_drafts=8))
    raw = c.calibration.priced(["a", "b"], [[0.6, 0.5, 0.4], [0.2]])
    assert raw == [[0.6, 0.5, 0.4], [0.2]]
    for _ in range(400):
        c.calibration.priced(["a"], [[0.6, 0.5, 0.4]])
        c.record_verified("a", 3, 0)  # never accepted
    assert c.calibration.scales()[0] < 0.1  # fed by record_verified: 0.6 priced, 0 accepted
    c.forget({"a"})
    assert set(c.calibration.predicted) == {"a"}
    assert "calibration" in c.state()
