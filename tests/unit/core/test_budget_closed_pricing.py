"""Closed batches (``core/budget_drain``): what a drain is priced by, where the hysteresis
anchor may sit, and how long a young batch's choice is kept (issue 22)."""

from __future__ import annotations

import random

from vllm_anyorder.core.budget import BudgetController
from vllm_anyorder.core.budget_drain import on_grid, thin
from vllm_anyorder.core.budget_settings import BudgetSettings, KeptDecision

from tests.unit.core.test_budget import verify


def test_the_anchor_is_put_on_the_grid_the_drain_search_values():
    assert on_grid(33, 16) == 32  # two drafts each and one more: not a count it values
    assert on_grid(3, 16) == 3  # the first four counts are all valued
    assert on_grid(33, 4) == 33  # batch 4 values every count
    for batch in (2, 4, 8, 16, 32):
        for rows in range(0, 130):
            snapped = on_grid(rows, batch)
            assert snapped <= rows
            # kept by thin at every length that reaches it (not only as the last count)
            assert snapped == 0 or snapped in thin(list(range(1, rows + 2)), batch)


def test_a_kept_decision_ends_when_the_batch_has_fewer_young_requests():
    kept, ids, yes = KeptDecision(hold=3), ["a", "b"], lambda plain: True
    kept.keep(ids, [0, 0], True, young=2)  # plain, chosen while both were young
    assert kept.reuse(ids, [8, 8], True, yes, young=2) == [0, 0]
    assert kept.reuse(ids, [8, 8], True, yes, young=0) is None  # settled since: decide
    kept.keep(ids, [0, 0], True, young=0)
    assert kept.reuse(ids, [8, 8], True, yes, young=0) == [0, 0]


def learnt(seed: int = 0) -> BudgetController:
    """A controller that learnt, on open batches of 4, that two drafts each pay (each
    accepted with 0.7; a step costs 5 ms plus 0.1 ms a row)."""
    rng = random.Random(seed)
    ctl = BudgetController(BudgetSettings(max_drafts=4))
    ids = [f"w{i}" for i in range(4)]
    for _ in range(300):
        caps = ctl.allot(ids, [4] * 4)
        committed = verify(ctl, rng, ids, caps, [0.7] * 4)
        rows = 4 + sum(caps)
        ctl.record_step(rows, any(caps), 0.005 + 0.0001 * rows, 4, committed)
    return ctl


def test_a_closed_batch_prices_its_requests_by_their_class_not_their_last_steps():
    """A request's own counts follow its last few steps (a burst: a loop found, a chain
    converged); in a closed batch they forecast its finish dozens of steps off, and rows went
    to the requests that had just missed while those in a loop got fewer (``jacobi`` at batch
    16 drafted 37-44 rows where two each, 48, paid). The drain prices each request by its
    class's engine-wide rates: requests with as many tokens left get as many rows."""
    ctl = learnt()
    ids = ["hot", "cold", "x", "y"]
    for _ in range(3):  # one request just accepted everything, another nothing
        ctl.record_verified("hot", 4, 4)
        ctl.record_verified("cold", 4, 0)
    assert ctl.accept.rate("hot", 0) > ctl.accept.rate("cold", 0) + 0.4
    personal = ctl._gains(ids, [4] * 4, 16)
    shared = ctl._gains(ids, [4] * 4, 16, personal=False)
    assert personal[0] != personal[1]  # the goodput rule's next-step forecast
    assert shared[0] == shared[1] == shared[2] == shared[3]  # the drain's


def test_only_a_closed_batchs_last_request_keeps_its_decision_as_the_batch_did():
    """A closed batch's tail of one keeps its decision a few steps, as the batch did (each
    fresh decision ~140 us of a ~3 ms step in the engine, issue 22); a request that came
    alone (a server at concurrency 1) is not such a tail (its hold does not grow: the test
    below)."""
    from vllm_anyorder.core.budget_drain import ClosedBatch
    alone = ClosedBatch()
    for _ in range(10):
        alone.tokens_left(["solo"], lambda: [100])
    assert not alone.alone
    tail = ClosedBatch()
    for _ in range(5):
        tail.tokens_left(["a", "b"], lambda: [100, 100])
    for _ in range(tail.watch.grace + 1):  # "b" left and nobody took its place
        tail.tokens_left(["a"], lambda: [100])
    assert tail.alone
    tail.tokens_left(["a", "c"], lambda: [100, 100])  # someone joined: open again
    assert not tail.alone

    rng, ctl = random.Random(1), learnt()

    def step(ids: list[str]) -> list[int]:
        caps = ctl.allot(ids, [4] * len(ids), lambda: [100] * len(ids))
        committed = verify(ctl, rng, ids, caps, [0.7] * len(ids))
        rows = len(ids) + sum(caps)
        ctl.record_step(rows, any(caps), 0.005 + 0.0001 * rows, len(ids), committed)
        return caps

    for _ in range(20):
        step(["t0", "t1"])
    reuse, reused = ctl.kept.reuse, []

    def counted(*args, **kw):
        caps = reuse(*args, **kw)
        reused.append(caps is not None)
        return caps
    ctl.kept.reuse = counted
    drafted = sum(bool(step(["t0"])[0]) for _ in range(60))  # the tail: "t1" finished
    assert drafted > 40  # it drafts there, most steps under a kept decision
    assert sum(reused[10:]) > 30


def reuses_between_fresh_decisions(ctl: BudgetController, ids: list[str],
                                   remaining, steps: int = 80) -> list[int]:
    """Run ``steps`` steps of batch ``ids`` (4 drafts allowed each, accepted with 0.7); the
    lengths of the runs of reused decisions to draft between fresh ones."""
    rng, reuse, runs = random.Random(3), ctl.kept.reuse, [0]

    def counted(*args, **kw):
        caps = reuse(*args, **kw)
        if caps is not None and any(caps):
            runs[-1] += 1
        elif runs[-1]:
            runs.append(0)
        return caps
    ctl.kept.reuse = counted
    for _ in range(steps):
        caps = ctl.allot(ids, [4] * len(ids), remaining)
        committed = verify(ctl, rng, ids, caps, [0.7] * len(ids))
        rows = len(ids) + sum(caps)
        ctl.record_step(rows, any(caps), 0.005 + 0.0001 * rows, len(ids), committed)
    return [r for r in runs if r]


def test_a_lone_requests_choice_to_draft_is_kept_a_few_steps_and_never_longer():
    """A request alone in an open batch (a server at concurrency 1) used to decide afresh
    every step, ~150 us of a ~3 ms step in the engine: now its choice to draft is reused
    ``closed_hold`` steps, then decided afresh (its own acceptance moves from step to step,
    so the hold does not grow with repeats as a closed batch's does)."""
    hold = BudgetSettings().closed_hold
    alone = reuses_between_fresh_decisions(learnt(), ["solo"], None)
    assert len(alone) > 10 and max(alone) == hold  # kept, and never longer
    closed = reuses_between_fresh_decisions(learnt(), ["c0", "c1"], lambda: [1000, 1000])
    assert max(closed) > hold  # a closed batch's hold grows while its choice repeats
    opened = reuses_between_fresh_decisions(learnt(), ["o0", "o1"], None)
    assert opened == []  # an open batch of two decides every step
