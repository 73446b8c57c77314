"""Probes where drafting has a fixed price (``budget_probes.priced_probe``) and probes that
wait for a step where a row may be drafted (``Explorer.choose``; issue 22, ``specdiff``'s
drafter at batch 1: a drafting step 11.6 ms against 5.0 ms plain, at one draft as at four)."""

from vllm_anyorder.core.budget_models import StepCost
from vllm_anyorder.core.budget_probes import Explorer, Upside, priced_probe
from vllm_anyorder.core.budget_settings import BudgetSettings
from tests.unit.core.lone_requests import lone_requests, speed


def upside(one: float | None, plain: float = 200.0, seconds: float = 0.0116,
           accept: float = 0.7, deeper: float | None = None) -> Upside:
    """Batch 1, a drafting step of ``seconds`` at any depth (``deeper``: the step's seconds
    past four drafts, a second drafter forward), drafts accepted at ``accept`` each (after
    their predecessor); ``one``: tokens / s of one draft, accepted, at its fastest step (the
    price in plain steps is 2 tokens against plain's one)."""
    def step(r: int) -> float:
        return deeper if deeper is not None and r > 4 else seconds

    def expected(r: int) -> float:
        return (1 + sum(accept ** j for j in range(1, r + 1))) / step(r)
    price = 2 * plain / one if one else None
    return Upside(expected, lambda r: (1 + r) / step(r), price, plain, plain * 1.03)


def test_a_fixed_price_probe_takes_the_most_drafts_near_the_count_predicted_best():
    # one draft, even accepted, commits 2 tokens in 11.6 ms: 172 / s against 200 plain;
    # every count costs the same step, so the deepest judges the most positions
    assert priced_probe(8, upside(one=172.0)) == 8
    # drafts seldom accepted (T=0.8): as deep, for the same price
    assert priced_probe(8, upside(one=172.0, accept=0.1)) == 8
    # a second drafter forward past four drafts (17 ms a step): four predicted best, and five
    # to eight fall more than 15% short of it
    assert priced_probe(8, upside(one=172.0, deeper=0.017)) == 4
    assert priced_probe(3, upside(one=172.0)) == 3  # within what the caller allows


def test_where_one_draft_could_pay_the_nearest_count_rule_stands():
    assert priced_probe(8, upside(one=260.0)) is None
    assert priced_probe(8, upside(one=None)) is None  # no drafting step seen yet
    assert priced_probe(0, upside(one=172.0)) is None  # nothing may be drafted


def test_no_fixed_price_probe_where_no_count_could_pay_even_if_every_draft_were_accepted():
    # a drafting step costing 50 ms: 9 tokens in 50 ms is still below plain's 200 / s
    assert priced_probe(8, upside(one=40.0, seconds=0.050)) is None


def test_a_probe_due_where_no_row_may_be_drafted_comes_an_eighth_of_its_gap_later():
    """A request's last step (no room left) takes no probe: taken there, it probed nothing
    and the next came a whole gap later (a gap of 256 fell on the last step of every
    request of 128 plain steps). Not due every step meanwhile either: a due probe keeps
    plain decisions from being reused."""
    s = BudgetSettings(warmup_steps=0)
    explore = Explorer(s, StepCost())
    assert explore.schedule.due(32, 32, 1) and explore.schedule.gap(1) == 32
    assert explore.choose(0, 0, 1, 32, 32) == (0, False)  # nothing may be drafted
    assert explore.count == 0
    assert not explore.schedule.due(35, 35, 1) and explore.schedule.due(36, 36, 1)
    rows, up = explore.choose(0, 4, 1, 36, 36)  # a row may be drafted: the probe runs
    assert up and rows > 0 and explore.schedule.last == 36


def run(steps: int, seed: int, mode: str = "auto") -> tuple[float, int]:
    """Lone requests (``lone_requests``) after plain steps at batch 2; a drafting step costs
    2.3 plain steps at any depth (``specdiff``'s drafter); each draft accepted with
    probability 0.8 after its predecessor. Returns (seconds, tokens)."""
    return lone_requests(steps, seed, mode)


def test_a_fixed_price_drafter_that_pays_is_found_from_the_start():
    """Four drafts give ~1.4x plain decoding here. The old rule probed one or two drafts,
    which cannot pay (2-3 tokens in 11.6 ms against 5 ms plain steps): each was owed to
    the books, and the first 600 steps ran at 0.77-0.85 of four drafts fixed."""
    for seed in range(3):
        auto_s, auto_t = run(600, seed)
        fixed_s, fixed_t = run(600, seed, "cycle:4")
        assert (auto_t / auto_s) / (fixed_t / fixed_s) > 0.9, seed


def warm_start(steps: int, seed: int, mode: str = "auto") -> float:
    """An engine's start as ``bench_switch`` runs it (``lone_requests``): plain and then
    four-draft steps at batch 2, then lone requests, where a drafting step costs 2.3 plain
    steps at any depth; requests 2-4 loop where the drafter cannot follow. Committed tokens
    per second at batch 1."""
    return speed(steps, seed, mode, most=4, loops=(2, 3, 4), warm_drafting=40,
                 drafting=(0.0120, 0.0002), plain=0.0052, noise=0.06)


def test_a_position_priced_low_in_the_warm_up_is_probed_again():
    """A few rows of the batch-2 warm-up can leave a position's rate and calibration low
    (0.32 and 0.32 where 0.8 were accepted): with probes of the fewest drafts predicted
    within 5% of the best (two), that position was never judged again, and two seeds of
    twenty stayed plain for 2,000 steps at 0.74-0.75 of four drafts fixed. Probing the most
    drafts within 15% of the best, the worst of the twenty runs 0.89."""
    for seed in range(20):
        ratio = warm_start(2000, seed) / warm_start(2000, seed, "cycle:4")
        assert ratio > 0.85, (seed, ratio)
