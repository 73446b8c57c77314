"""Drafting prices per batch size (``core/budget_floor``): a floor under the rows-only cost
model where requests cost more than draft rows, and what it changes in a closed batch."""

from __future__ import annotations

from vllm_anyorder.core.budget_drain import DrainValue, drain_seconds, water_fill
from vllm_anyorder.core.budget_floor import YOUNG, DraftingFloor


def measured(floor: DraftingFloor, batch: int, rows: int, seconds: float) -> None:
    for _ in range(YOUNG):
        floor.observe(batch, rows, seconds)


def test_no_floor_before_a_point_is_mature():
    f = DraftingFloor()
    for _ in range(YOUNG - 1):
        f.observe(16, 32, 0.0072)
    assert f(16, 17) == 0.0 and f(8, 16) == 0.0
    f.observe(16, 32, 0.0072)
    assert f(16, 17) == 0.0072  # one point, no batch size with two: flat below it
    assert f(16, 40) == 0.0072  # above its points: the highest (the cost model prices more)


def test_below_its_fewest_rows_a_batch_falls_by_a_draft_rows_cost():
    f = DraftingFloor()
    measured(f, 16, 32, 0.0072)
    measured(f, 16, 48, 0.0088)  # 0.1 ms a draft row at batch 16
    assert abs(f(16, 40) - 0.0080) < 1e-12
    assert abs(f(16, 17) - (0.0072 - 15 * 0.0001)) < 1e-12
    measured(f, 8, 16, 0.0053)  # one point: the least slope of the others
    assert abs(f(8, 10) - (0.0053 - 6 * 0.0001)) < 1e-12


def test_a_point_follows_faster_steps_fast_and_slower_ones_slowly():
    f = DraftingFloor()
    measured(f, 16, 32, 0.008)
    f.observe(16, 32, 0.006)
    assert abs(f(16, 32) - 0.007) < 1e-12
    f.observe(16, 32, 0.012)
    assert abs(f(16, 32) - 0.00725) < 1e-12
    measured(f, 16, 24, 0.009)  # never above a point with more rows
    assert f(16, 24) == f(16, 32)


def test_drain_seconds_prices_drafting_steps_at_least_the_floor():
    # two requests, 10 and 20 tokens left, the second drafting (rate 2): 10 steps of both
    # (drafting, 3 rows), then nothing left
    cost = {(3, True): 0.005, (2, False): 0.004, (1, False): 0.003}
    seconds = drain_seconds([10, 20], [1.0, 2.0], [0, 1], lambda n, d: cost[(n, d)])
    assert abs(seconds - 10 * 0.005) < 1e-12
    floored = drain_seconds([10, 20], [1.0, 2.0], [0, 1], lambda n, d: cost[(n, d)],
                            lambda batch, rows: 0.007 if batch == 2 else 0.0)
    assert abs(floored - 10 * 0.007) < 1e-12


def test_a_closed_batch_does_not_draft_a_few_rows_the_floor_prices_as_drafting():
    # 16 requests, 50 tokens left each, drafts accepted 0.6; the rows-only tables (measured at
    # batch 8) price 17 rows drafting at 5.1 ms against 5.4 ms plain at 16 requests: one draft
    # row looks better than none. Batch 16's own drafting steps cost 7.2 ms at 32 rows and 8.8
    # at 48: with them as the floor no partial first round pays
    remaining = [50 + i % 3 for i in range(16)]
    order = water_fill(remaining, [[0.6, 0.4]] * 16, 32)
    plain = [0.0] + [0.0034 + 0.00013 * n for n in range(1, 49)]
    plain[16] = 0.0054
    drafting = [0.0051 + 0.0001 * max(0, n - 17) for n in range(49)]

    def tables(is_drafting, depth):
        return drafting if is_drafting else plain

    unfloored = DrainValue(remaining, order, tables, [0] + [1] * 16 + [2] * 16)
    assert unfloored(1) > unfloored(0)  # the confounded price: one row "pays"
    f = DraftingFloor()
    measured(f, 16, 32, 0.0072)
    measured(f, 16, 48, 0.0088)
    floored = DrainValue(remaining, order, tables, [0] + [1] * 16 + [2] * 16, f)
    assert all(floored(r) < floored(0) for r in range(1, 8))
