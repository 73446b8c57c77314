"""The budget's row arithmetic and trust region (``core/budget_rows.py``)."""

from vllm_anyorder.core.budget import BudgetController
from vllm_anyorder.core.budget_rows import TrustRegion, candidates, deepest, prefix_sums
from vllm_anyorder.core.budget_settings import BudgetSettings


def test_prefix_sums_are_the_expected_drafts_of_the_first_rows():
    assert prefix_sums([0.9, 0.5, 0.25]) == [0.0, 0.9, 1.4, 1.65]


def test_deepest_chain_follows_the_rows_taken_in_order():
    order = [(0.9, 0), (0.8, 1), (0.7, 0), (0.6, 0), (0.5, 1)]  # (gain, batch row)
    assert deepest(order, 2) == [0, 1, 1, 2, 3, 3]


def test_candidates_are_dense_to_16_then_geometric_and_end_at_the_total():
    assert candidates(0) == [] and candidates(3) == [1, 2, 3]
    c = candidates(100)
    assert c[:16] == list(range(1, 17)) and c[-1] == 100 and c == sorted(set(c))
    assert all(b - a <= max(1, a // 8) for a, b in zip(c[16:-1], c[17:-1]))
    assert len(c) < 40


def test_trust_region_doubles_from_one_draft_per_request_and_counts_larger_batches():
    trust = TrustRegion()
    assert trust.reach(8) == 8  # nothing measured: one draft per request
    trust.observe(8, 16)
    assert trust.reach(8) == 24 and trust.reach(4) == 28  # rows <= 2 x 16
    assert trust.reach(16) == 16  # a smaller batch's steps say nothing about a larger one
    trust.observe(16, 32)
    assert trust.reach(8) == 56 and trust.reach(16) == 48


def test_a_larger_batch_explores_its_rows_by_doubling():
    """Deep chains learned at batch 8 (flat cost, drafts always accepted) must not send
    batch 16 into one step of 16 x 17 rows: its first drafting step verifies one draft per
    request, each later one at most twice the widest before it; it still reaches the maximum."""
    ctl = BudgetController(BudgetSettings(max_drafts=16))
    widest, seen = 0, []
    for step in range(400):
        ids = [f"r{i}" for i in range(8 if step < 200 else 16)]
        caps = ctl.allot(ids, [16] * len(ids))
        rows = len(ids) + sum(caps)
        ctl.record_step(rows, any(caps), 0.010, len(ids), rows)
        for req_id, k in zip(ids, caps):
            if k:
                ctl.record_verified(req_id, k, k)
        if step < 200:
            widest = max(widest, rows)
        elif any(caps):
            seen.append(rows)
    assert widest == 8 * 17
    assert seen[0] <= 2 * 16
    assert all(b <= 2 * max(seen[:i + 1]) for i, b in enumerate(seen[1:]))
    assert max(seen) == 16 * 17
