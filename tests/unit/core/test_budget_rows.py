"""The budget's row arithmetic (``core/budget_rows.py``)."""

from vllm_anyorder.core.budget_rows import candidates, deepest, prefix_sums


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
