"""Tensor parallel 2 (mp executor, one core per rank): greedy `jacobi` equals the
single-process run without speculation; both ranks evolve the same Jacobi state."""

import pytest

from e2e.conftest import make_llm, shutdown

pytestmark = pytest.mark.e2e

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
            states = llm.collective_rpc(lambda w: w.model_runner.drafter.live_request_ids)
        finally:
            shutdown(llm)
        assert got == want[name]
        assert len(states) == 2 and states[0] == states[1]  # same state on every rank
