"""The budget's per-step work stays small without changing a decision (issue 22: the overhead
when the controller drafts nothing is part of every plain step's cost).

Each shortcut is checked against the long way: the candidate scan that stops once no more
rows can win, the relaxation that only touches positions with counts, the cached cost points.
"""

import random

import pytest

from vllm_anyorder.core.budget import BudgetController
from vllm_anyorder.core.budget_accept import Acceptance
from vllm_anyorder.core.budget_models import StepCost
from vllm_anyorder.core.budget_settings import BudgetSettings
from tests.unit.core.test_budget import verify


def _run(ctl: BudgetController, accept: list[float], cost, steps: int, seed: int) -> list:
    rng = random.Random(seed)
    req_ids = [f"r{i}" for i in range(len(accept))]
    caps_seen = []
    for step in range(steps):
        if step and step % 97 == 0:  # a request leaves, another joins
            req_ids = req_ids[1:] + [f"n{step}"]
        caps = ctl.allot(req_ids, [16] * len(req_ids))
        rows = len(req_ids) + sum(caps)
        tokens = verify(ctl, rng, req_ids, caps, accept)
        seconds = cost(rows, any(caps)) * (1 + 0.2 * rng.random())
        ctl.record_step(rows, any(caps), seconds, len(req_ids), tokens)
        ctl.forget(set(req_ids))
        caps_seen.append(caps)
    return caps_seen


def test_the_candidate_scan_stops_early_without_changing_a_decision():
    # ``stages`` returning 1 prices every depth exactly as no ``stages`` does, but turns the
    # early stop off (it needs cost that never falls with rows within one stage): the two
    # controllers must decide the same, step for step, across regimes that draft and not
    curves = [lambda r, d: 0.004 + 0.0002 * r + 0.001 * d,  # rows cheap: drafts pay
              lambda r, d: 0.004 * r,  # every row a plain step: never
              lambda r, d: 0.004 + 0.0001 * max(0, r - 9) + 0.0005 * d]  # flat, then a knee
    for curve in curves:
        for accept in ([0.0], [0.8], [0.0, 0.9, 0.3, 0.6], [0.05] * 8):
            fast = _run(BudgetController(BudgetSettings(max_drafts=16)), accept, curve, 400, 1)
            slow = _run(BudgetController(BudgetSettings(max_drafts=16), lambda depth: 1),
                        accept, curve, 400, 1)
            assert fast == slow


def test_relax_fades_every_judged_position_and_leaves_the_rest_zero():
    acc = Acceptance(8, request_decay=0.5)
    acc.observe("r", 6, 2)  # positions 0, 1 accepted, 2 rejected, 3-5 never judged
    acc.relax("r")
    own = acc.requests["r"]
    assert own[:3] == [[0.5, 0.5], [0.5, 0.5], [0.0, 0.5]]
    assert all(c == [0.0, 0.0] for c in own[3:])
    acc.observe("r", 8, 7)  # deeper now: every position judged
    acc.relax("r")
    assert own[7] == [0.0, 0.5] and own[6] == [0.5, 0.5]
    acc.forget(set())
    assert acc.requests == {} and acc._judged == {}


def test_a_bucket_keeps_a_low_figure_for_decisions_and_the_mean_for_the_books():
    """``predict`` is a low quantile (noise only slows steps); ``typical``, the guard's
    baseline, is the running mean of the plain steps there, slow ones included: a drafting
    step charged against the low figure would be booked as losing when it is as fast as a
    typical plain step."""
    rng = random.Random(0)
    cost = StepCost()
    samples = [0.006 + 0.002 * rng.random() + (0.024 if rng.random() < 0.05 else 0.0)
               for _ in range(2000)]
    for step, s in enumerate(samples):
        cost.observe(8, False, s, step)
    mean = sum(samples) / len(samples)
    assert cost.predict(8, False) < 0.85 * mean
    assert 0.7 * mean < cost.typical(8) < 1.5 * mean
    assert cost.typical(4) is None  # never measured
    cost.observe(4, False, 0.030, 0)  # young: the fastest sample, as the quantile
    cost.observe(4, False, 0.010, 1)
    cost.observe(4, False, 0.011, 2)
    assert cost.typical(4) == pytest.approx(0.010)


def test_cached_cost_points_follow_every_sample():
    cost = StepCost()
    for _ in range(3):
        cost.observe(1, False, 0.010, 0)
        cost.observe(9, True, 0.012, 0)
    drafting = cost.points(True)
    assert cost.points(True) is drafting  # cached
    cost.observe(1, False, 0.008, 1)  # a plain sample: the drafting points stand
    assert cost.points(True) is drafting
    assert cost.predict(1, False) == pytest.approx(0.009)  # halfway to a faster sample
    cost.observe(9, True, 0.006, 2)
    assert cost.points(True) is not drafting and cost.predict(9, True) < 0.012


def test_the_price_table_is_the_interpolation_at_every_count_to_the_last_bit():
    """``price_table`` walks segment by segment; every count must get exactly the float
    ``interpolate`` gives it (decisions compare these prices), repeated and fractional
    bucket rows, a single point and the far tail point included."""
    from vllm_anyorder.core.budget_curves import interpolate, price_table
    from vllm_anyorder.core.budget_models import _FAR
    rng = random.Random(3)
    for _ in range(2000):
        xs = sorted(rng.choice([rng.uniform(0.5, 90.0), float(rng.randint(1, 90))])
                    for _ in range(rng.randint(1, 6)))
        if len(xs) > 1 and rng.random() < 0.2:
            xs[1] = xs[0]
        if rng.random() < 0.3:
            xs.append(xs[-1] + _FAR)
        pts = list(zip(xs, sorted(rng.uniform(0.001, 0.05) for _ in xs)))
        upto = rng.randint(0, 140)
        assert price_table(pts, upto) == [interpolate(pts, float(x)) for x in range(upto + 1)]
