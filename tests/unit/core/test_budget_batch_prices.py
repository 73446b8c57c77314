"""Drafting prices per batch size (``core/budget_batch_prices``): where requests cost more
than draft rows, each batch size's own drafting steps price it, not a pooled curve by rows."""

from __future__ import annotations

from vllm_anyorder.core.budget import BudgetController
from vllm_anyorder.core.budget_batch_prices import BatchPrices
from vllm_anyorder.core.budget_drain import DrainValue, drain_seconds, water_fill
from vllm_anyorder.core.budget_models import YOUNG_SAMPLES
from vllm_anyorder.core.budget_settings import BudgetSettings


def measured(prices: BatchPrices, batch: int, rows: int, seconds: float) -> None:
    for _ in range(YOUNG_SAMPLES):
        prices.observe(batch, rows, seconds)


def none(rows: int) -> None:
    return None


def test_no_price_before_a_point_is_mature():
    p = BatchPrices()
    for _ in range(YOUNG_SAMPLES - 1):
        p.observe(16, 32, 0.0072)
    assert p.price(16, 17, 1, none) is None and p.price(8, 16, 1, none) is None
    p.observe(16, 32, 0.0072)
    assert p.price(16, 17, 1, none) == 0.0072  # one point, no batch size with two: flat
    assert p.price(16, 17, 2, none) is None  # another drafter stage: its own points


def test_between_points_a_line_below_them_a_draft_rows_cost_past_them_the_pooled_rise():
    p = BatchPrices()
    measured(p, 16, 32, 0.0072)
    measured(p, 16, 48, 0.0088)  # 0.1 ms a draft row at batch 16
    assert abs(p.price(16, 40, 1, none) - 0.0080) < 1e-12
    assert abs(p.price(16, 17, 1, none) - (0.0072 - 15 * 0.0001)) < 1e-12
    assert abs(p.price(16, 64, 1, lambda n: 0.001 + 0.0002 * n) - (0.0088 + 16 * 0.0002)) < 1e-12
    measured(p, 8, 16, 0.0053)  # one point, no pooled curve: the least slope of the others
    assert abs(p.price(8, 10, 1, none) - (0.0053 - 6 * 0.0001)) < 1e-12


def test_below_its_one_point_a_batch_size_is_priced_by_the_pooled_curves_fall():
    """A closed batch's tail at 4 requests measured only its deep chains (26 rows, 49.5 ms):
    flat from there, every fewer row count was priced as dear and drafting never paid again
    (784 of 800 simulated steps plain, issue 22); the pooled curve's fall prices them."""
    p = BatchPrices()
    measured(p, 4, 26, 0.0495)
    pooled = lambda n: 0.0105 + 0.0015 * n  # noqa: E731 (the drafting arm's curve)
    assert abs(p.price(4, 8, 1, pooled) - (0.0495 - 18 * 0.0015)) < 1e-12
    assert p.price(4, 26, 1, pooled) == 0.0495


def test_a_point_follows_faster_steps_fast_and_slower_ones_slowly():
    p = BatchPrices()
    measured(p, 16, 32, 0.008)
    p.observe(16, 32, 0.006)
    assert abs(p.price(16, 32, 1, none) - 0.007) < 1e-12
    p.observe(16, 32, 0.012)
    assert abs(p.price(16, 32, 1, none) - 0.00725) < 1e-12
    measured(p, 16, 24, 0.009)  # never above a point with more rows
    assert p.price(16, 24, 1, none) == p.price(16, 32, 1, none)


def test_drain_seconds_prices_drafting_steps_from_the_batch_sizes_own():
    # two requests, 10 and 20 tokens left, the second drafting (rate 2): 10 steps of both
    # (drafting, 3 rows), then nothing left
    cost = {(3, True): 0.005, (2, False): 0.004, (1, False): 0.003}
    seconds = drain_seconds([10, 20], [1.0, 2.0], [0, 1], lambda n, d: cost[(n, d)])
    assert abs(seconds - 10 * 0.005) < 1e-12
    own = drain_seconds([10, 20], [1.0, 2.0], [0, 1], lambda n, d: cost[(n, d)],
                        lambda requests, rows: 0.007 if requests == 2 else None)
    assert abs(own - 10 * 0.007) < 1e-12


def test_a_closed_batch_does_not_draft_a_few_rows_its_own_steps_price_as_drafting():
    # 16 requests, about 50 tokens left each, drafts accepted 0.6; the pooled tables (learnt
    # at batch 8) price 17 rows drafting at 5.1 ms against 5.4 ms plain at 16 requests: one
    # draft row looks better than none. Batch 16's own drafting steps: 7.2 ms at 32 rows and
    # 8.8 at 48; priced by them no partial first round pays
    remaining = [50 + i % 3 for i in range(16)]
    order = water_fill(remaining, [[0.6, 0.4]] * 16, 32)
    plain = [0.0] + [0.0034 + 0.00013 * n for n in range(1, 49)]
    plain[16] = 0.0054
    drafting = [0.0051 + 0.0001 * max(0, n - 17) for n in range(49)]

    def tables(is_drafting, depth):
        return drafting if is_drafting else plain

    depth = [0] + [1] * 16 + [2] * 16
    pooled = DrainValue(remaining, order, tables, depth)
    assert pooled(1) > pooled(0)  # the confounded price: one row "pays"
    p = BatchPrices()
    measured(p, 16, 32, 0.0072)
    measured(p, 16, 48, 0.0088)
    own = DrainValue(remaining, order, tables, depth,
                     lambda requests, rows, d: p.price(requests, rows, 1, none))
    assert all(own(r) < own(0) for r in range(1, 8))


def test_the_searches_price_a_batch_size_from_its_own_steps():
    # batch 8's own steps: 16 rows 6.6 ms, 24 rows 6.7 ms; the pooled curve (batch 16's
    # steps of 24 rows) says 7.0 ms at 24; the row search prices two drafts each at 6.7
    ctl = BudgetController(BudgetSettings(max_drafts=4))
    for _ in range(YOUNG_SAMPLES):
        ctl.cost.observe(16, False, 0.0054, 0)
        ctl.cost.observe(24, True, 0.0070, 0)
        ctl.prices.observe(8, 16, 0.0066)
        ctl.prices.observe(8, 24, 0.0067)
    assert abs(ctl.search.seconds(8, 16) - 0.0067) < 1e-12
    assert abs(ctl.search.seconds(16, 8) - 0.0070) < 1e-12  # batch 16 has none: pooled


def test_below_a_lone_point_a_fixed_drafting_price_is_not_priced_away():
    """Issue 22, ``specdiff`` on Zen 4: a batch-2 warm-up drafted 4-10 rows at 14-17 ms
    against 6.6 ms plain at 2 rows (the drafter's forward), then a lone request drafted four
    (5 rows, 13.9 ms). A one-draft step there (2 rows) fell along the pooled curve down to
    the plain steps it is anchored on: priced 5.2 ms, it took 13-19 ms, and was chosen first
    and probed at a loss. Below the drafting arm's fewest rows the fall is a drafting row's
    cost, not the drafter's price."""
    ctl = BudgetController(BudgetSettings(max_drafts=8), lambda depth: 1)
    for _ in range(YOUNG_SAMPLES):
        ctl.cost.observe(1, False, 0.0058, 0)
        ctl.cost.observe(2, False, 0.0066, 0)
        for rows, seconds in ((4, 0.0140), (6, 0.0150), (8, 0.0160), (10, 0.0170)):
            ctl.cost.observe(rows, True, seconds, 0)
        ctl.prices.observe(1, 5, 0.0139)
    one_draft = ctl.search.seconds(1, 1, 1)
    assert 0.0120 < one_draft <= 0.0139  # it took 13-19 ms; 5.2 ms before
    assert ctl.search.seconds(1, 4, 4) == 0.0139
    # a closed batch's drain prices it alike
    drain = ctl.search.drain_prices(ctl.cost.price_tables(16, ctl.search.stage))
    assert drain(1, 2, 1) == one_draft
    # where drafting has no fixed price, rows fall along the drafting rows' own cost
    ctl = BudgetController(BudgetSettings(max_drafts=8))
    for _ in range(YOUNG_SAMPLES):
        ctl.cost.observe(1, False, 0.0043, 0)
        ctl.cost.observe(2, False, 0.0046, 0)
        for rows in (4, 8, 12, 16):
            ctl.cost.observe(rows, True, 0.0040 + 0.0003 * rows, 0)
        ctl.prices.observe(1, 9, 0.0067)
    assert abs(ctl.search.seconds(1, 1, 1) - (0.0067 - 7 * 0.0003)) < 1e-9
