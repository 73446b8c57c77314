"""What changing arm costs (``core/budget_switch``): measured, kept out of the steady price,
and paid for before the controller leaves drafting for plain."""

from __future__ import annotations

import random

from vllm_anyorder.core.budget import BudgetController
from vllm_anyorder.core.budget_settings import BudgetSettings
from vllm_anyorder.core.budget_switch import MIN_SAMPLES, SwitchCost
from tests.unit.core.test_budget import verify


def test_no_excess_before_both_kinds_of_step_were_measured():
    s = SwitchCost()
    assert s.observe(False, 0.005, 0.005) is False  # the first step switches nothing
    for _ in range(MIN_SAMPLES):
        s.observe(True, 0.008, 0.008)
        assert s.observe(False, 0.007, 0.005) is True
    assert s.excess() == 0.0  # no steady plain step yet
    for _ in range(MIN_SAMPLES):
        s.observe(False, 0.0052, 0.005)
    # switched: 2 ms over the price; steady: 0 once and 0.2 ms three times (their mean)
    assert abs(s.excess() - (0.002 - 0.00015)) < 1e-9


def test_unpriced_steps_are_not_counted_and_a_switch_still_changes_the_arm():
    s = SwitchCost()
    s.observe(True, 0.008, None)
    assert s.observe(False, 0.007, None) is True
    assert s.state()[1] == []


def test_a_switched_plain_step_is_learnt_without_its_excess_and_drafting_as_it_is():
    s = SwitchCost()
    for _ in range(4):  # plain steps in a run: at their price
        s.observe(False, 0.005, 0.005)
    for _ in range(MIN_SAMPLES):  # a drafting step, then a plain one 1 ms over its price
        s.observe(True, 0.008, 0.008)
        assert s.observe(False, 0.006, 0.005)
    assert abs(s.excess() - 0.001) < 1e-9
    assert abs(s.steady(False, 0.006, True) - 0.005) < 1e-9
    assert s.steady(False, 0.006, False) == 0.006
    assert s.steady(True, 0.009, True) == 0.009


def flat(rows: int, drafting: bool) -> float:
    # a small model on a CPU: a nearly flat step, drafting adds a fixed overhead
    return 0.005 + 0.00005 * rows + (0.0015 if drafting else 0.0)


def run(switch_cost: float, steps=1500, batch=16, seed=0, accept=lambda step: 0.6):
    """One open batch of ``batch`` requests accepting each draft with ``accept(step)``; a plain
    step right after a drafting one costs ``switch_cost`` more. (simulated seconds per token,
    the controller, plain steps after drafting ones)."""
    rng = random.Random(seed)
    ctl = BudgetController(BudgetSettings(max_drafts=4))
    ids = [f"r{i}" for i in range(batch)]
    seconds_all, tokens_all, last, trips = 0.0, 0, False, 0
    for step in range(steps):
        p = accept(step)
        caps = ctl.allot(ids, [4] * batch)
        drafting = any(caps)
        rows = batch + sum(caps)
        seconds = flat(rows, drafting) + (switch_cost if last and not drafting else 0.0)
        seconds *= 1 + 0.05 * rng.random()
        trips += last and not drafting
        last = drafting
        tokens = verify(ctl, rng, ids, caps, [p] * batch)
        ctl.record_step(rows, drafting, seconds, batch, tokens)
        seconds_all, tokens_all = seconds_all + seconds, tokens_all + tokens
    return seconds_all / tokens_all, ctl, trips


def spells(step: int) -> float:
    """Drafts accepted in spells of 300 steps: well (drafting pays), then hardly (plain)."""
    return 0.7 if (step // 300) % 2 == 0 else 0.02


def test_the_plain_price_stays_the_steady_one_where_switching_costs():
    _, ctl, trips = run(switch_cost=0.002, accept=spells)
    assert trips >= MIN_SAMPLES  # drafting left for plain, now and then: the excess measured
    assert abs(ctl.switch.excess() - 0.002) < 0.0006
    # not dragged up by the switched steps (a plain step's low quantile, noise 0-5%)
    assert ctl.cost.predict(16, False) < flat(16, False) * 1.05


def test_switch_costs_do_not_change_what_a_free_switch_world_does():
    # without any switch cost the excess stays ~0 and the controller behaves as before:
    # drafting pays here (p = 0.6, 16 requests) and it drafts nearly every step
    per_token, ctl, _ = run(switch_cost=0.0)
    assert ctl.switch.excess() < 0.0002
    assert ctl.totals["steps_without_drafts"] < 0.1 * ctl.totals["steps"]


def stubbed(anchor_val: float, plain_val: float, excess: float) -> BudgetController:
    """A controller of an open batch of 16 that drafted 16 rows last, its predictions fixed:
    plain ``plain_val`` tokens / s at 5 ms a step, any drafting row count ``anchor_val``;
    leaving drafting measured at ``excess`` seconds; no probe, books and trust wide open."""
    ctl = BudgetController(BudgetSettings(max_drafts=4))
    ctl.chosen, ctl.switch.last = (16, 16), True
    ctl.switch.excess = lambda: excess
    ctl.search.goodput = lambda batch, r, gain, depth=0: anchor_val if r else plain_val
    ctl.search.seconds = lambda batch, r, depth=0: 0.005
    ctl.search.best_open = lambda batch, prefix, depth, most, plain, need: (0, plain)
    ctl.search.affordable = lambda batch, most, depth, room: most
    ctl.trust.reach = lambda batch: 64
    ctl.explore.choose = lambda best, *args: (best, False)
    return ctl


def test_leaving_drafting_must_pay_the_measured_round_trip():
    ids = [f"r{i}" for i in range(16)]
    # drafting predicted 2% below plain: with no switch cost measured, plain it is
    assert sum(stubbed(0.98, 1.0, 0.0).allot(ids, [4] * 16)) == 0
    # a 2 ms round trip over 8 plain steps of 5 ms is 5% of them: drafting is kept
    assert sum(stubbed(0.98, 1.0, 0.002).allot(ids, [4] * 16)) == 16
    # ... but not where plain is predicted to gain more than the round trip costs
    assert sum(stubbed(0.94, 1.0, 0.002).allot(ids, [4] * 16)) == 0
