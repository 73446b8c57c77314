"""Tensor parallel 2 (mp executor, one core per rank): greedy `specdiff` equals the
single-process run without speculation, with a randomised drafter (random unmasking order,
temperature 1) whose per-rank generators must agree; both ranks run the same drafter forwards."""

import pytest

from e2e.conftest import make_llm, shutdown

pytestmark = [pytest.mark.e2e, pytest.mark.serial]  # TP ranks: a core each

PROMPTS = ["abc", "hello world", "klmnop\nab", "def f(x):", "zz", "ghij kl", "a b c", "p"]


def test_tp2_specdiff_equals_single_process(cyclic_llama, cyclic_drafter, monkeypatch):
    from vllm import SamplingParams

    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    llm = make_llm(cyclic_llama)
    want = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    shutdown(llm)
    llm = make_llm(cyclic_llama, tensor_parallel_size=2,
                   speculative_config={"method": "specdiff", "model": str(cyclic_drafter),
                                       "num_speculative_tokens": 8},
                   additional_config={"anyorder": {"specdiff": {
                       "steps": 4, "schedule": "random", "temperature": 1.0, "seed": 3}}})
    try:
        got = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params, use_tqdm=False)]
        counters = llm.collective_rpc(
            lambda w: (w.model_runner.drafter.drafter_calls, w.model_runner.drafter._steps))
    finally:
        shutdown(llm)
    assert got == want
    assert len(counters) == 2 and counters[0] == counters[1] and counters[0][0] > 0
