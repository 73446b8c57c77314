"""Tensor parallel 2 (mp executor, one core per rank): a diffusion LLM decoded with `freedave`
(and Dream with `ssd`, one KV head replicated) equals the engine-free reference decoder, greedy
and seeded sampling; both ranks run the same denoising forwards in lock-step and hold the same
per-request state and the same speculation budget state (rank 0's round times are shared, so
every rank caps the same drafts)."""

import pytest

from e2e.conftest import make_llm, shutdown
from e2e.test_dllm_decoding import BLOCK, MAX_TOKENS, PROMPTS, STEPS, _generate, _params, _reference

pytestmark = [pytest.mark.e2e, pytest.mark.serial]  # TP ranks: a core each


@pytest.mark.parametrize("kind,method", [("llada", "freedave"), ("dream", "ssd")])
def test_tp2_dllm_equals_the_reference(tmp_path_factory, monkeypatch, kind, method):
    from tiny_models import build_tiny_dllm

    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    path = build_tiny_dllm(tmp_path_factory.mktemp(kind), kind, seed=4)
    greedy = _params()
    sampled = _params(0.9, seeds=[3 * i + 2 for i in range(len(PROMPTS))])
    llm = make_llm(path, tensor_parallel_size=2,
                   speculative_config={"method": method, "num_speculative_tokens": 3},
                   additional_config={"anyorder": {method: {"block_length": BLOCK,
                                                            "steps_per_block": STEPS}}},
                   max_model_len=256, max_num_batched_tokens=256)
    try:
        got = _generate(llm, PROMPTS, greedy)
        got_sampled = _generate(llm, PROMPTS, sampled)
        ranks = llm.collective_rpc(lambda w: (sorted(
            (r["prompt_len"], r["max_tokens"], r["temperature"], r["forwards"], r["nodes"])
            for r in w.model_runner.drafter.finished), w.model_runner.drafter.budget.digest(),
            w.model_runner.drafter.budget.stats()))
    finally:
        shutdown(llm)
    assert got == _reference(path, kind, PROMPTS, greedy)
    assert got_sampled == _reference(path, kind, PROMPTS, sampled)
    assert len(ranks) == 2 and ranks[0] == ranks[1] and len(ranks[0][0]) >= len(MAX_TOKENS)
    assert ranks[0][2]["mode"] == "auto" and ranks[0][2]["steps"] > 0
