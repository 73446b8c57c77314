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
