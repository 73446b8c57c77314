"""core.jacobi_refined: the budget learns Jacobi acceptance at refined positions only."""

from vllm_anyorder.core.jacobi_refined import RefinedPositions


def test_only_positions_the_last_verification_refined_are_counted():
    r = RefinedPositions()
    assert r.counted([("a", 8, 3)]) == []  # nothing refined yet: a cold chain teaches nothing
    # 8 drafted, 3 accepted: the next chain's first 5 positions are new iterates, so of the
    # next 8 drafts (6 accepted) only the first 5 count
    assert r.counted([("a", 8, 6)]) == [("a", 5, 5)]
    # then 2 refined: a shorter chain counts whole
    assert r.counted([("a", 1, 0)]) == [("a", 1, 0)]
    assert r.depth["a"] == 1


def test_a_step_without_drafts_shifts_the_iterate_and_refines_nothing():
    r = RefinedPositions()
    r.counted([("a", 6, 2)])  # 4 refined
    r.counted([("a", 0, 0)])
    assert r.depth["a"] == 3
    assert r.counted([("a", 6, 6)]) == [("a", 3, 3)]


def test_departed_requests_are_forgotten():
    r = RefinedPositions()
    r.counted([("a", 4, 1), ("b", 4, 0)])
    r.forget({"b"})
    assert set(r.depth) == {"b"} and r.probe_hold == 2


def test_it_is_a_budget_counting_rule():
    from vllm_anyorder.contract import BudgetCounting

    assert isinstance(RefinedPositions(), BudgetCounting)
