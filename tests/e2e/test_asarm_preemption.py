"""An AS-ARM request that vLLM preempts is recomputed as one prefill of prompt + outputs:
the prompt rows must attend to the prompt only (bidirectionally) and the outputs causally
(patch ``asarm_prompt_lens``), at their true positions for infill requests. With a KV cache
too small for the batch, plain decoding and greedy `assd` still equal the reference model's
greedy decoding token for token."""

import random

import pytest

from e2e.conftest import make_llm, shutdown

pytestmark = pytest.mark.e2e

MAX_TOKENS = 150
# small cache: 9 blocks of 128 tokens (2 layers x 1 KV head x 32 x fp32 x K,V = 512 B per
# token); 8 requests of ~190 tokens need 16, so vLLM preempts and recomputes


@pytest.fixture(scope="module")
def asarm(tmp_path_factory):
    from asarm_models import build_tiny_asarm

    return build_tiny_asarm(tmp_path_factory.mktemp("asarm_preempt"), vocab_size=64,
                            tokenizer=False)


@pytest.fixture(scope="module")
def prompts():
    """8 requests: continuations, and (odd ones) infill requests whose MAX_TOKENS masks are
    scattered over the sequence (their recompute needs the position table too)."""
    rng = random.Random(0)
    out = []
    for i in range(8):
        prompt = [rng.randrange(64) for _ in range(40 + i)]
        masked = None
        if i % 2:
            masked = rng.sample(range(len(prompt) + MAX_TOKENS), MAX_TOKENS)
            masked = sorted(masked) if i % 4 == 1 else masked  # ascending or any order
        out.append((prompt, masked))
    return out


def _greedy(asarm, prompts, **kw):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = make_llm(asarm, max_model_len=256, skip_tokenizer_init=True, **kw)
    try:
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p, _ in prompts],
                            [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                                            ignore_eos=True,
                                            extra_args=m and {"anyorder_infill": m})
                             for _, m in prompts], use_tqdm=False)
        preemptions = sum(getattr(m, "value", 0) or 0 for m in llm.get_metrics()
                          if m.name == "vllm:num_preemptions")
    finally:
        shutdown(llm)
    return [list(o.outputs[0].token_ids) for o in outs], preemptions


@pytest.fixture(scope="module")
def reference(asarm, prompts):
    """The plain model with room for every request (equal to the pure-PyTorch reference's
    logits: test_assd_greedy.py); far faster than decoding with the dense reference."""
    tokens, preemptions = _greedy(asarm, prompts)
    assert preemptions == 0
    return tokens


@pytest.mark.parametrize("spec", [None, {"method": "assd", "num_speculative_tokens": 4}],
                         ids=["plain", "assd"])
def test_preempted_requests_decode_like_the_reference(asarm, prompts, reference, spec):
    tokens, preemptions = _greedy(asarm, prompts, kv_cache_memory_bytes=600_000,
                                  **({"speculative_config": spec,  # the self drafter
                                      "additional_config": {"anyorder": {"assd": {
                                          "drafter": "self"}}}} if spec else {}))
    assert preemptions > 0  # the recompute path really ran
    assert tokens == reference
