"""Bookkeeping held back (core/budget_backlog.py: plain steps; ``BudgetController.held``:
steps under a kept decision to draft) decides exactly as step by step.

The same random histories drive two controllers: one as the engine does (plain steps' records
and fades, and a reused drafting decision's records, held back until something reads them)
and one that applies every update in its own step, as before the backlog (records never held,
each fade by ``Acceptance.relax_plain``).
Their caps must be equal at every step, and their whole state (the fingerprint plus every
request's own counts) at the end.
"""

import random

import pytest

from vllm_anyorder.core.budget import BudgetController
from vllm_anyorder.core.budget_accept import Acceptance
from vllm_anyorder.core.budget_backlog import PlainBacklog
from vllm_anyorder.core.budget_settings import BudgetSettings


class _StepByStep:
    """A backlog that holds nothing: each plain step's fade applied at once, the old way."""

    steps: list = []

    def __init__(self, accept: Acceptance) -> None:
        self.accept = accept

    def __bool__(self) -> bool:
        return False

    def hold_relax(self, req_ids, fade) -> None:
        self.accept.relax_plain(req_ids, [0] * len(req_ids))


def _history(seed: int, step_by_step: bool, steps: int = 1500, churn: float = 0.01):
    """Caps per step and the final state of one controller on history ``seed``: batches that
    change now and then, acceptance per request (some never, some often), noisy step times
    with stalls, closed and open stretches."""
    rng = random.Random(seed)
    ctl = BudgetController(BudgetSettings(max_drafts=8))
    size = rng.choice([1, 2, 4, 8])
    req_ids = [f"s{seed}-{i}" for i in range(size)]
    accept = {r: rng.choice([0.0, 0.05, 0.5, 0.9]) for r in req_ids}
    born, caps_log = size, []
    if step_by_step:
        ctl.backlog = _StepByStep(ctl.accept)
        ctl.defer_records = False  # a kept decision's drafting records applied at once too
    held_steps = 0

    def flush():
        if step_by_step:
            ctl._holding = False  # the next plain record is applied at once

    for step in range(steps):
        if rng.random() < churn:  # a request leaves, another joins
            req_ids = req_ids[1:] + [f"s{seed}-{born}"]
            accept[req_ids[-1]] = rng.choice([0.0, 0.5, 0.9])
            born += 1
            if rng.random() < 0.7:  # the adapter forgets on a change of batch (not always)
                ctl.forget(set(req_ids))
                flush()
        closed = step % 500 > 350
        # now and then no request may draft (a prefill chunk, the end of the context): caps
        # of zeros under a kept decision to draft
        limits = [0] * len(req_ids) if rng.random() < 0.05 else [8] * len(req_ids)
        caps = ctl.allot(req_ids, limits,
                         (lambda: [400 - step % 500] * len(req_ids)) if closed else None)
        flush()
        caps_log.append(list(caps))
        tokens = 0
        for req_id, k in zip(req_ids, caps):
            n = 0
            while n < k and rng.random() < accept[req_id]:
                n += 1
            if k:
                ctl.record_verified(req_id, k, n)
                flush()
            tokens += n + 1
        rows = len(req_ids) + sum(caps)
        seconds = (0.004 + 0.0004 * rows) * (1 + 0.1 * rng.random())
        if rng.random() < 0.01:
            seconds *= 6  # a stall
        ctl.record_step(rows, any(caps), seconds, len(req_ids), tokens)
        held_steps += bool(ctl.held)
        flush()
    state = ctl.state()  # (flushes: what follows reads the controller's insides)
    own = {r: [list(c) for c in counts] for r, counts in ctl.accept.requests.items()}
    return caps_log, state, own, dict(ctl.totals), ctl.summary(), held_steps


@pytest.mark.parametrize("seed", range(8))
def test_held_back_bookkeeping_decides_as_step_by_step(seed):
    held, eager = _history(seed, False), _history(seed, True)
    assert held[0] == eager[0]  # every step's caps
    assert held[1:5] == eager[1:5]  # fingerprint, own counts, totals, the log line
    assert sum(1 for caps in held[0] if not any(caps)) > 50  # plain stretches were held
    assert eager[5] == 0


@pytest.mark.parametrize("seed", range(8))
def test_records_held_under_a_kept_decision_to_draft_decide_as_step_by_step(seed):
    """A batch that never changes: closed stretches (their decisions kept) of 1-8 requests."""
    held, eager = _history(seed, False, churn=0.0), _history(seed, True, churn=0.0)
    assert held[0] == eager[0]
    assert held[1:5] == eager[1:5]
    assert eager[5] == 0
    _HELD[seed] = held[5]


_HELD: dict[int, int] = {}


def test_records_were_held_under_kept_decisions_to_draft():
    """The histories above held drafting records back (else they tested nothing new)."""
    for seed in range(8):
        if seed not in _HELD:
            _HELD[seed] = _history(seed, False, churn=0.0)[5]
    assert sum(_HELD.values()) > 50 and sum(1 for n in _HELD.values() if n) >= 4


def test_the_backlog_holds_plain_steps_until_read():
    ctl = BudgetController(BudgetSettings(max_drafts=4))
    ids = ["a"]
    for _ in range(60):  # learn that drafts are never accepted: plain decisions, kept
        caps = ctl.allot(ids, [4])
        if caps[0]:
            ctl.record_verified("a", caps[0], 0)
        ctl.record_step(1 + caps[0], bool(caps[0]), 0.004 + 0.001 * caps[0], 1, 1)
    ctl.allot(ids, [4])
    ctl.record_step(1, False, 0.004, 1, 1)
    assert ctl.backlog.steps  # held, and counted as measured already
    measured = ctl.measured
    ctl.flush()
    assert not ctl.backlog and ctl.measured == measured


def test_relax_steps_is_relax_plain_repeated():
    a, b = Acceptance(4), Acceptance(4)
    for acc in (a, b):
        acc.observe("x", 4, 2)
        acc.observe("y", 3, 0)
    for _ in range(7):
        a.relax_plain(["x", "y", "z"], [0, 0, 0])
    b.relax_steps(["x", "y", "z"], 7)
    assert a.requests == b.requests


def test_a_different_batch_fades_what_is_pending_first():
    faded = []
    log = PlainBacklog()
    for ids in (["a"], ["a"], ["a", "b"], ["a", "b"], ["a", "b"]):
        log.hold_relax(ids, lambda i, n: faded.append((list(i), n)))
    assert faded == [(["a"], 2)]
    log.replay_relax(lambda i, n: faded.append((list(i), n)))
    assert faded == [(["a"], 2), (["a", "b"], 3)] and not log
