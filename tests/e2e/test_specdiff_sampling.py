"""At temperature > 0 (also with top-k / top-p and n > 1) `specdiff` samples from exactly the
target's distribution: chi-square tests of every speculated position against the exact
conditionals of the target's weights, on a 16-token vocabulary with thousands of samples.

The drafter is a tiny masked-diffusion model trained on the target's own samples, so its
drafts are often accepted and the rejection rule (point-mass drafts: accept d with p(d),
else resample from p without d) is really exercised; the statistic's power against a wrong
rule at this sample size is shown in test_jacobi_sampling.py (same prompt, sizes, target).
Drafts are revealed in confidence order over several steps, i.e. not left to right: the case
where the drafter's per-position probabilities must not be used as q."""

import pytest
import torch

from e2e.conftest import make_llm, shutdown, spec_metrics
from e2e.sampling import (MAX_TOKENS, N_PER_REQ, NUM_REQ, P_MIN, PROMPT, SETTING_IDS, SETTINGS,
                          exact, sample, small_vocab_llama)
from stats import conditional_chisquare, truncated_probs

__all__ = ["exact", "small_vocab_llama"]  # fixtures used by name

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def small_vocab_drafter(small_vocab_llama, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from tiny_models import build_tiny_drafter

    model = AutoModelForCausalLM.from_pretrained(small_vocab_llama, dtype=torch.float32).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT] * 256), max_new_tokens=10, do_sample=True,
                             top_k=0, eos_token_id=None, pad_token_id=1)
    return build_tiny_drafter(tmp_path_factory.mktemp("v16_drafter"), out.tolist(),
                              vocab_size=16, steps=200)


@pytest.fixture(scope="module")
def specdiff_llm(small_vocab_llama, small_vocab_drafter):
    llm = make_llm(small_vocab_llama, skip_tokenizer_init=True, max_num_seqs=256,
                   speculative_config={"method": "specdiff", "model": str(small_vocab_drafter),
                                       "num_speculative_tokens": 3},
                   additional_config={"anyorder": {"specdiff": {"steps": 3}}})
    yield llm
    shutdown(llm)


@pytest.mark.parametrize("params_kw", SETTINGS, ids=SETTING_IDS)
def test_specdiff_sampling_matches_the_target(specdiff_llm, exact, params_kw):
    before = spec_metrics(specdiff_llm).get("vllm:spec_decode_num_accepted_tokens", 0)
    samples = sample(specdiff_llm, params_kw)
    assert len(samples) == NUM_REQ * N_PER_REQ and all(len(s) == MAX_TOKENS for s in samples)
    accepted = spec_metrics(specdiff_llm)["vllm:spec_decode_num_accepted_tokens"] - before
    assert accepted > 0.2 * len(samples)  # drafts really were accepted (the rule is exercised)

    def cond(prefix):
        return truncated_probs(exact(prefix), **params_kw)

    for pos in range(MAX_TOKENS):
        stat, df, p = conditional_chisquare(samples, pos, cond)
        assert df > 0
        assert p > P_MIN, f"position {pos}: chi2={stat:.1f} df={df} p={p:.2e}"
