"""A small KV cache forces vLLM to preempt dLLM requests; a preempted request is recomputed as
one prompt (prompt + committed tokens), its partial block's K/V are rewritten by a repair
forward, and every output still equals the engine-free reference decoder."""

import pytest

from e2e.conftest import make_llm, shutdown
from e2e.test_dllm_decoding import _generate, _reference

pytestmark = pytest.mark.e2e

BLOCK = 8


@pytest.mark.parametrize("method", ["stepwise", "ssd"])
def test_preempted_requests_decode_like_the_reference(tmp_path_factory, method):
    from vllm import SamplingParams

    from tiny_models import build_tiny_dllm

    path = build_tiny_dllm(tmp_path_factory.mktemp("llada"), "llada", seed=5)
    spec = None if method == "stepwise" else {"method": "ssd", "num_speculative_tokens": 3}
    # 2 layers x 2 KV heads x 32 x (K, V) x 4 bytes = 1 KiB per token: room for ~200 tokens,
    # while the batch below needs ~420
    llm = make_llm(path, speculative_config=spec, kv_cache_memory_bytes=200 << 10, block_size=32,
                   additional_config={"anyorder": {method: {"block_length": BLOCK}}},
                   max_model_len=128, max_num_batched_tokens=128, max_num_seqs=8)
    try:
        prompts = [[5 + i, 6 + i, 7, 8, 9, 10 + i, 11, 12, 13, 14] for i in range(6)]
        params = [SamplingParams(temperature=0.0 if i % 2 else 0.7, seed=i, max_tokens=60,
                                 ignore_eos=True) for i in range(6)]
        got = _generate(llm, prompts, params)
        preempted = sum(m.value for m in llm.get_metrics()
                        if m.name == "vllm:num_preemptions" and hasattr(m, "value"))
        rows = llm.collective_rpc(lambda w: list(w.model_runner.drafter.finished))[0]
    finally:
        shutdown(llm)
    assert preempted > 0, "the KV cache was not small enough to preempt"
    assert any(r["repairs"] > 0 for r in rows)
    assert got == _reference(path, "llada", prompts, params)
