"""The budget adapter (proposers/budget.py): what it measures from vLLM's steps."""

import pytest

from vllm_anyorder.proposers import budget as budget_module
from vllm_anyorder.proposers.budget import StepBudget


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(budget_module.time, "perf_counter", c)
    return c


def step(b, clock, req_ids, sampled, scheduled, caps_limits, seconds):
    """One engine step as the proposer base drives it; returns the caps."""
    b.verified(req_ids, scheduled)
    start = clock.now
    b.begin(req_ids, sampled)
    caps = b.caps(req_ids, caps_limits)
    b.end(req_ids, [[7] * c for c in caps], start)
    clock.now += seconds
    return caps


def test_steps_are_measured_only_when_the_batch_ran_unchanged(clock):
    b = StepBudget("auto", 4)
    recorded = []
    b.controller.record_step = lambda rows, drafting, s, *counts: recorded.append((rows, drafting, s))
    caps = step(b, clock, ["a"], [[1]], None, [4], 0.010)  # first step: nothing to close
    assert recorded == []
    step(b, clock, ["a"], [[1, 2]], [caps[0]], [4], 0.020)
    assert recorded == [(1 + caps[0], caps[0] > 0, pytest.approx(0.010))]
    step(b, clock, ["a", "b"], [[1], [5]], [0, 0], [4, 4], 0.030)  # "b" joined: not clean
    step(b, clock, ["a", "b"], [[1], []], [0, 0], [4, 4], 0.030)  # "b" partial prefill
    assert len(recorded) == 1


def test_acceptance_counts_only_our_drafts(clock):
    b = StepBudget("cycle:2", 4)
    b.controller.kind = "auto"  # measure, while the caps stay the hook's
    seen = []
    b.controller.record_verified = lambda r, k, acc: seen.append((r, k, acc))
    b.controller.allot = lambda req_ids, limits, remaining=None: [2, 0]
    step(b, clock, ["a", "b"], [[1], [1]], None, [4, 4], 0.01)
    # vLLM padded "b" to [token, -1, -1] (scheduled 2) but we drafted nothing for it
    step(b, clock, ["a", "b"], [[1, 2], [3]], [2, 2], [4, 4], 0.01)
    assert seen == [("a", 2, 1)]


def test_fixed_budget_measures_nothing_and_keeps_limits(clock):
    b = StepBudget("fixed", 8)
    for _ in range(3):
        assert step(b, clock, ["a", "b"], [[1], [1]], [8, 3], [8, 3], 0.01) == [8, 3]
    assert b.controller.measured == 0 and b.stats()["mode"] == "fixed"


def test_tp_ranks_record_rank_zero_measurement(clock):
    class Group:
        rank_in_group = 1

        def broadcast_object(self, obj, src=0):
            assert src == 0
            return 0.5  # rank 0 measured this

    b = StepBudget("auto", 4, tp_group=Group())
    recorded = []
    b.controller.record_step = lambda rows, drafting, s, *counts: recorded.append(s)
    step(b, clock, ["a"], [[1]], None, [4], 0.010)
    step(b, clock, ["a"], [[1]], [0], [4], 0.010)
    assert recorded == [0.5]


def test_dllm_rounds_are_recorded_like_steps():
    """``round_done`` (a dLLM denoising round the proposer timed itself): cost only for clean
    rounds, acceptance of drafted requests, per-request state kept for the batch's requests."""
    b = StepBudget("auto", 4)
    steps, verified = [], []
    b.controller.record_step = lambda rows, drafting, s, *counts: steps.append((rows, drafting, s))
    real = b.controller.record_verified
    b.controller.record_verified = lambda r, k, acc: (verified.append((r, k, acc)),
                                                      real(r, k, acc))
    b.round_done(["a", "b", "c"], 5, True, True, 0.02, [("a", 3, 2), ("b", 0, 0)])
    b.round_done(["a", "b", "c"], 2, False, False, 0.5, [("c", 0, 0)])  # a repair ran
    assert steps == [(5, True, 0.02)] and verified == [("a", 3, 2)]
    b.round_done(["a"], 1, False, True, 0.01, [])
    assert set(b.controller.accept.requests) == {"a"}


def test_dllm_rounds_feed_the_reality_check():
    """A round's progress (baseline steps moved: 1 + accepted drafts per request) per second
    is what the reality check compares: drafting rounds that move fewer steps per second than
    plain ones stop drafting, whatever the cost and acceptance models predict."""
    b = StepBudget("auto", 4)
    c = b.controller
    for _ in range(8):
        b.round_done(["a", "b"], 2, False, True, 0.010, [("a", 0, 0), ("b", 0, 0)])  # 200/s
    c.last.probe = False
    for _ in range(8):  # two drafts each, one kept: 4 steps in 0.025 s = 160/s
        b.round_done(["a", "b"], 6, True, True, 0.025, [("a", 2, 1), ("b", 2, 1)])
    assert c.reality.realized.rate(2, False, c.decisions, 10**6) == pytest.approx(200.0)
    assert c.reality.realized.rate(2, True, c.decisions, 10**6) == pytest.approx(160.0)
    assert c.reality.lost(2, c.decisions)


def test_dllm_rounds_under_fixed_budget_measure_nothing():
    class Group:
        rank_in_group = 0

        def broadcast_object(self, obj, src=0):
            raise AssertionError("fixed mode must not add a collective per round")

    b = StepBudget("fixed", 4, tp_group=Group())
    assert not b.measuring()
    b.round_done(["a"], 4, True, True, 0.02, [("a", 3, 3)])
    assert b.controller.measured == 0 and b.controller.totals["drafted"] == 0


def test_a_step_is_recorded_with_its_deepest_chain(clock):
    """The depth the drafter ran for (``stages`` prices it: specdiff's forwards per depth)."""
    b = StepBudget("auto", 8)
    recorded = []
    b.controller.record_step = lambda rows, drafting, s, batch, tokens, depth: \
        recorded.append((rows, drafting, depth))
    plan = iter([[3, 1], [0, 0], [0, 0]])
    b.controller.allot = lambda req_ids, limits, remaining=None: next(plan)
    step(b, clock, ["a", "b"], [[1], [1]], None, [8, 8], 0.01)
    step(b, clock, ["a", "b"], [[1, 2], [1]], [3, 1], [8, 8], 0.01)
    step(b, clock, ["a", "b"], [[1], [1]], [0, 0], [8, 8], 0.01)
    assert recorded == [(2 + 4, True, 3), (2, False, 0)]


def test_the_trace_directory_is_made_and_steps_are_written(clock, tmp_path, monkeypatch):
    """``VLLM_ANYORDER_BUDGET_TRACE`` naming a directory not made yet used to fail the
    proposer's constructor, and with it the engine's start."""
    trace_dir = tmp_path / "not" / "yet"
    monkeypatch.setenv(budget_module.TRACE_ENV, str(trace_dir))
    b = StepBudget("auto", 4)
    caps = step(b, clock, ["a"], [[1]], None, [4], 0.010)
    step(b, clock, ["a"], [[1, 2]], [caps[0]], [4], 0.020)
    b._trace.flush()
    lines = [line for f in trace_dir.iterdir() for line in f.read_text().splitlines()]
    assert len(lines) >= 1 and '"rows"' in lines[0]
    # the first step, with nothing measured, is the controller's probe of plain decoding;
    # a trace says which steps were probes (benchmarks/trace_losses, RESULTS' breakdowns)
    assert '"probe": true' in lines[0]
