"""Tensor parallel 2 (mp executor, one core per rank): greedy `jacobi` equals the
single-process run without speculation; both ranks evolve the same Jacobi state and the same
speculation budget (rank 0's step times are shared, so every decision is the same)."""

import pytest

from e2e.conftest import make_llm, shutdown

pytestmark = [pytest.mark.e2e, pytest.mark.serial]  # TP ranks: a core each

PROMPTS = ["abc", "hello world", "klmnop\nab", "def f(x):", "zz", "ghij kl", "a b c", "p"]


def test_tp2_jacobi_equals_single_process(cyclic_llama, tiny_llama, monkeypatch):
    from vllm import SamplingParams

    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    want = {}
    for name, model in (("cyclic", cyclic_llama), ("random", tiny_llama)):
        llm = make_llm(model)
        want[name] = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params, use_tqdm=False)]
        shutdown(llm)
    for name, model in (("cyclic", cyclic_llama), ("random", tiny_llama)):
        llm = make_llm(model, tensor_parallel_size=2,
                       speculative_config={"method": "jacobi", "num_speculative_tokens": 8})
        try:
            got = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params, use_tqdm=False)]
            # per-request state and the budget controller's state (decisions included)
            states = llm.collective_rpc(lambda w: (w.model_runner.drafter.live_request_ids,
                                                   w.model_runner.drafter.budget.digest(),
                                                   w.model_runner.drafter.budget.stats()))
        finally:
            shutdown(llm)
        assert got == want[name]
        assert len(states) == 2 and states[0] == states[1]  # same state on every rank
        assert states[0][2]["mode"] == "auto" and states[0][2]["steps"] > 0
