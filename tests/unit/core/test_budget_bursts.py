"""A request's acceptance after what its last chain did (core/budget_accept.py, issue 22).

Drafts come in bursts: after a first-draft miss a Jacobi chain is rarely accepted deep, after a
whole chain it usually is again. A request is priced by its own counts of the class its last
chain puts it in (miss / partial / whole), shrunk towards the engine-wide rate of that class;
pooled over requests, that rate mixes likely and unlikely ones (bounded below).
"""

import random

from vllm_anyorder.core.budget import BudgetController
from vllm_anyorder.core.budget_accept import (AFTER_MISS, AFTER_PART, AFTER_WHOLE, Acceptance,
                                              after_class)
from vllm_anyorder.core.budget_settings import BudgetSettings
from tests.unit.core.test_budget import verify


def test_the_class_a_chain_leaves():
    assert after_class(8, 0) == AFTER_MISS
    assert after_class(8, 3) == AFTER_PART
    assert after_class(8, 8) == AFTER_WHOLE


def bursty_history(acc, req_id="r", rounds=4, run=5):
    """Runs of misses and runs of whole chains: after a miss the next chain mostly misses,
    after a whole chain it is mostly whole."""
    for _ in range(rounds):
        for accepted in [0] * run + [8] * run:
            chain(acc, req_id, 8, accepted)


def chain(acc, req_id, drafted, accepted):
    """A verified chain, counted whole (as a method without a counting rule has it)."""
    acc.observe(req_id, drafted, accepted)
    acc.chain_done(req_id, drafted, accepted)


def test_a_chain_after_a_miss_is_priced_below_one_after_a_whole_chain():
    acc = Acceptance(8)
    bursty_history(acc)
    assert acc.after["r"] == AFTER_WHOLE
    after_whole = acc.gains("r", 8)
    chain(acc, "r", 8, 0)
    assert acc.after["r"] == AFTER_MISS
    after_miss = acc.gains("r", 8)
    assert after_whole[-1] > 0.5 > after_miss[-1]
    assert after_whole[0] > after_miss[0]
    # the engine-wide rates (a closed batch's drain, ``personal=False``) know no class
    run, products = 1.0, []
    for rate in acc.engine_rates(acc.age_class("r")):
        run *= rate
        products.append(run)
    assert acc.gains("r", 8, personal=False) == products


def test_a_step_without_drafts_forgets_the_class_and_leaving_forgets_all():
    acc = Acceptance(8)
    bursty_history(acc)
    chain(acc, "r", 8, 0)
    classed = acc.gains("r", 8)
    acc.relax("r")  # a step without drafts: the next chain starts anew
    assert "r" not in acc.after
    assert acc.gains("r", 8) != classed
    chain(acc, "r", 8, 0)  # no class before it: only the class-less counts move
    assert acc.after["r"] == AFTER_MISS
    acc.forget(set())
    assert acc.after == {} and acc.chained == {} and acc.requests == {}


def test_a_requests_own_counts_by_class_hold_its_own_chains_only():
    acc = Acceptance(8)
    bursty_history(acc, "a")  # a: misses after misses, whole chains after whole ones
    chain(acc, "b", 8, 8)
    chain(acc, "b", 8, 8)  # b: whole chains; one after a whole one
    chain(acc, "a", 8, 0)
    chain(acc, "a", 8, 0)
    chained = acc.chained["b"]  # b's counts by class: its own chains only
    assert chained[AFTER_WHOLE - 1][0] == [1.0, 1.0]
    assert chained[AFTER_MISS - 1][0] == [0.0, 0.0]
    assert acc.gains("b", 8)[-1] > 0.5


def simulate_bursts(steps=600, seed=0):
    """One request whose chains follow its last one: after a miss each draft is kept with
    probability 0.3 only at the first position (deeper ones never), after a hit with 0.97.
    A row costs a fifth of a plain step's 10 ms. Returns the non-probe caps by the class
    the request was in when they were chosen."""
    rng = random.Random(seed)
    ctl = BudgetController(BudgetSettings(max_drafts=16))
    by_class = {AFTER_MISS: [], AFTER_PART: [], AFTER_WHOLE: []}
    missed = True
    for _ in range(steps):
        cls = ctl.accept.after.get("r")
        caps = ctl.allot(["r"], [16])
        k = caps[0]
        ctl.record_step(1 + k, k > 0, 0.010 + 0.0004 * k)
        n = 0
        if missed:
            n = 1 if k and rng.random() < 0.3 else 0
        else:
            while n < k and rng.random() < 0.97:
                n += 1
        if k:
            ctl.record_verified("r", k, n)
            ctl.record_chain("r", k, n)
            missed = n == 0
        if cls in by_class and not ctl.last.probe and k:
            by_class[cls].append(k)
    return by_class


def test_the_controller_drafts_short_after_a_miss_and_deep_after_a_hit():
    by_class = simulate_bursts()
    after_miss, after_hit = by_class[AFTER_MISS], by_class[AFTER_PART] + by_class[AFTER_WHOLE]
    assert after_miss and after_hit
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    assert median(after_miss) <= 4 < 12 <= median(after_hit)


def test_rows_still_go_to_the_likely_request_with_classes():
    """``test_budget``'s two requests accepted independently (0.95 and 0.05 a draft), here
    with every chain's class recorded: the pooled class after a miss is mostly the unlikely
    request's, so right after the likely one's rare miss it is priced low for a step, and the
    unlikely one after its rare hit high (11 of 189 steps gave the unlikely one as many rows;
    without classes 0-3)."""
    rng = random.Random(0)
    ctl = BudgetController(BudgetSettings(max_drafts=16))
    ids, accept, chosen = ["r0", "r1"], [0.95, 0.05], []
    for _ in range(400):
        caps = ctl.allot(ids, [16, 16])
        ctl.record_step(2 + sum(caps), any(caps), 0.010 + 0.002 * (2 + sum(caps)))
        verify(ctl, rng, ids, caps, accept, classes=True)
        if not ctl.last.probe:
            chosen.append(caps)
    chosen = chosen[len(chosen) // 2:]
    assert chosen and sum(c[0] > 0 for c in chosen) >= 0.95 * len(chosen)
    assert sum(c[1] >= c[0] for c in chosen) <= len(chosen) // 12
    assert sum(c[1] > 0 for c in chosen) <= len(chosen) // 3


def goodput(accept, classes, seed, steps=800):
    """Tokens per simulated second of requests accepting drafts independently (``accept``),
    with or without every chain's class recorded."""
    rng = random.Random(seed)
    ctl = BudgetController(BudgetSettings(max_drafts=16))
    ids = [f"r{i}" for i in range(len(accept))]
    tokens = seconds = 0.0
    for _ in range(steps):
        caps = ctl.allot(ids, [16] * len(ids))
        step = 0.010 + 0.002 * (len(ids) + sum(caps))
        ctl.record_step(len(ids) + sum(caps), any(caps), step)
        seconds += step
        tokens += verify(ctl, rng, ids, caps, accept, classes)
    return tokens / seconds


def test_classes_cost_little_where_drafts_are_independent():
    """No bursts to find: the classes only split the counts (0.97-1.01 of the goodput
    without them over these mixes, three seeds each)."""
    for accept in [(0.95, 0.05), (0.9, 0.5), (0.7, 0.7, 0.3, 0.3)]:
        without = sum(goodput(accept, False, seed) for seed in range(3))
        assert sum(goodput(accept, True, seed) for seed in range(3)) >= 0.95 * without


def test_a_class_without_counts_is_forgotten_when_its_request_leaves():
    acc = Acceptance(8)
    acc.chain_done("r", 8, 0)  # a chain its method's rule did not count: a class, no counts
    acc.forget(set())
    assert acc.after == {}


def test_a_step_without_drafts_forgets_a_class_without_counts():
    acc = Acceptance(8)
    acc.chain_done("r", 8, 0)
    acc.relax_plain(["r"], [0])
    assert acc.after == {}
