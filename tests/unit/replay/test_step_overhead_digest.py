"""``benchmarks/bench_step_overhead --controller --digest``: the budget under simulated time
decides the same every run, so a refactor meant to change nothing can be checked by its
digest (issue 22)."""

import hashlib

import vllm_anyorder.proposers.budget as budget_module
from benchmarks.bench_step_overhead import controller_us


def digest_of(batch, accept, closed=64, steps=400):
    digest = hashlib.sha256()
    controller_us(batch, accept, steps=steps, closed=closed, digest=digest)
    return digest.hexdigest()


def test_the_same_simulation_gives_the_same_decisions_and_restores_the_clock():
    real = budget_module.time
    assert digest_of(4, 0.7) == digest_of(4, 0.7)
    assert budget_module.time is real


def test_the_digest_sees_a_different_workload():
    assert digest_of(4, 0.7) != digest_of(4, 0.0)
    assert digest_of(4, 0.7) != digest_of(2, 0.7)


def test_the_plain_step_shortcut_decides_as_the_generic_record(monkeypatch):
    """``StepBudget._plain_step`` (a clean step that drafted nothing, issue 22's plain-step
    cost) must leave the controller exactly where the generic ``_record`` does: the digests
    of open and closed batches, drafts accepted or not, match with the shortcut replaced by
    the generic call."""
    fast = {(b, a, c): digest_of(b, a, closed=c) for b in (1, 4) for a in (0.0, 0.7)
            for c in (0, 64)}

    def generic(self, batch, seconds):
        self._record(list(batch), len(batch), False, True, seconds,
                     [(r, 0, 0) for r in batch])

    monkeypatch.setattr(budget_module.StepBudget, "_plain_step", generic)
    assert fast == {key: digest_of(*key[:2], closed=key[2]) for key in fast}
