"""core.jacobi_refined: the budget learns Jacobi acceptance at refined positions only."""

from vllm_anyorder.core.jacobi_refined import RefinedPositions


def test_only_positions_the_last_verification_refined_are_counted():
    r = RefinedPositions()
    r.warmup = 0  # the counting rule alone (past a request's warm-up)
    assert r.counted([("a", 8, 3)]) == []  # nothing refined yet: a cold chain teaches nothing
    # 8 drafted, 3 accepted: the next chain's first 5 positions are new iterates, so of the
    # next 8 drafts (6 accepted) only the first 5 count
    assert r.counted([("a", 8, 6)]) == [("a", 5, 5)]
    # then 2 refined: a shorter chain counts whole
    assert r.counted([("a", 1, 0)]) == [("a", 1, 0)]
    assert r.depth["a"] == 1


def test_a_step_without_drafts_shifts_the_iterate_and_refines_nothing():
    r = RefinedPositions()
    r.warmup = 0  # the counting rule alone (past a request's warm-up)
    r.counted([("a", 6, 2)])  # 4 refined
    r.counted([("a", 0, 0)])
    assert r.depth["a"] == 3
    assert r.counted([("a", 6, 6)]) == [("a", 3, 3)]


def test_departed_requests_are_forgotten():
    r = RefinedPositions()
    r.warmup = 0  # the counting rule alone (past a request's warm-up)
    r.counted([("a", 4, 1), ("b", 4, 0)])
    r.forget({"b"})
    assert set(r.depth) == {"b"} and r.probe_hold == 2


def test_it_is_a_budget_counting_rule():
    from vllm_anyorder.contract import BudgetCounting

    assert isinstance(RefinedPositions(), BudgetCounting)


def test_positions_drafted_anew_count_like_refined_ones():
    r = RefinedPositions()
    r.warmup = 0  # the counting rule alone (past a request's warm-up)
    r.counted([("a", 4, 4)])  # accepted whole: nothing of the next chain is refined
    assert r.counted([("a", 8, 8)]) == []
    # a chain whose first 6 drafts were spliced from a pooled n-gram: those 6 were judged
    r.drafted("a", 6)
    assert r.counted([("a", 8, 8)]) == [("a", 6, 6)]
    r.drafted("a", 2)  # all 8 were kept, so nothing is refined: the splice decides
    assert r.counted([("a", 8, 5)]) == [("a", 2, 2)]
    r.drafted("a", 1)  # 3 refined by that verification reach further than the splice
    assert r.counted([("a", 8, 0)]) == [("a", 3, 0)]
    r.forget(set())
    assert not r.depth and not r.fresh


def test_a_spliced_chain_reports_its_length():
    from vllm_anyorder.core.jacobi import JacobiSettings, JacobiState

    loop = [5, 6, 7, 8] * 4
    state = JacobiState(JacobiSettings(block_size=8), loop)
    # the text's last (7, 8) is followed by 4 tokens: those 4 are spliced over the head
    assert state.next_chain(6)[:4] == [5, 6, 7, 8] and state.spliced == 4
    cold = JacobiState(JacobiSettings(block_size=8), [1, 2, 3])
    cold.next_chain(4)
    assert cold.spliced == 0
    off = JacobiState(JacobiSettings(block_size=8, recycle="off"), loop)
    off.next_chain(4)
    assert off.spliced == 0


def test_a_requests_first_two_drafting_steps_are_not_counted():
    """Its iterates start from nothing: accepted per draft 0.02-0.18 in a request's first two
    drafting steps against 0.36-0.60 from its fourth (batch 16, issue 22); counted, they kept
    every new batch's first steps plain."""
    r = RefinedPositions()
    r.drafted("a", 4)
    assert r.counted([("a", 4, 0)]) == []  # from nothing (the splice too: the prompt's)
    assert r.counted([("a", 4, 0)]) == []  # refined once
    assert r.counted([("a", 4, 1)]) == [("a", 4, 1)]  # warm
    r.counted([("a", 0, 0)])  # plain steps do not make it cold again: the pool heads it
    r.drafted("a", 2)
    assert r.counted([("a", 4, 2)]) == [("a", 2, 2)]
    assert r.counted([("b", 0, 0)]) == [] and "b" not in r.runs  # no drafts: no warm-up


def test_drafting_that_starts_after_a_requests_first_steps_counts_at_once():
    """The warm-up applies within a request's first steps only: a probe that reaches a request
    once in its life must teach the budget something, or an engine that started plain stays
    plain (seen: a batch-4 engine, 99% of its steps plain, no draft ever counted, issue 22)."""
    r = RefinedPositions()
    for _ in range(r.warmup_window):
        assert r.counted([("a", 0, 0)]) == []  # plain steps
    r.drafted("a", 3)
    assert r.counted([("a", 3, 1)]) == [("a", 3, 1)]  # its first drafting step, counted
    r.forget(set())
    assert not r.age and not r.runs


def _recounted(r: RefinedPositions, outcomes):
    """The counting rule, written out step by step (the reference for ``counted``)."""
    out = []
    for req_id, k, accepted in outcomes:
        refined = r.depth.get(req_id, 0)
        judged = max(refined, r.fresh.pop(req_id, 0))
        age = r.age[req_id] = min(r.age.get(req_id, 0) + 1, r.warmup_window + 1)
        warm = r.runs.get(req_id, 0) >= r.warmup or age > r.warmup_window
        if k and not warm:
            r.runs[req_id] = r.runs.get(req_id, 0) + 1
        elif k and judged:
            out.append((req_id, min(k, judged), min(accepted, judged)))
        r.depth[req_id] = k - accepted if k else max(0, refined - 1)
    return out


def test_counting_agrees_with_the_rule_written_out():
    """``counted`` takes a short path for requests that drafted nothing (most steps where
    drafts do not pay); outcomes and state must be the rule's, step for step."""
    import random

    rng = random.Random(5)
    fast, slow = RefinedPositions(), RefinedPositions()
    ids = [f"q{i}" for i in range(6)]
    for step in range(400):
        outcomes = []
        for req_id in ids:
            k = rng.choice([0, 0, 0, 1, 3, 8])
            outcomes.append((req_id, k, rng.randint(0, k) if k else 0))
        spliced = {req_id: rng.randint(0, 3) for req_id in ids if rng.random() < 0.3}
        for req_id, n in spliced.items():
            fast.drafted(req_id, n)
            slow.drafted(req_id, n)
        assert fast.counted(outcomes) == _recounted(slow, outcomes)
        assert (fast.depth, fast.fresh, fast.runs, fast.age) == \
            (slow.depth, slow.fresh, slow.runs, slow.age)
        if step % 50 == 49:  # a batch turns over
            ids = ids[2:] + [f"q{step}a", f"q{step}b"]
            fast.forget(set(ids))
            slow.forget(set(ids))
