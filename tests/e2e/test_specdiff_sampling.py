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
                          assert_fits, exact, sample, small_vocab_llama)
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
                   additional_config={"anyorder": {"specdiff": {"steps": 3, "budget": "fixed"}}})
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

    assert_fits(samples, cond, redraw=lambda: sample(specdiff_llm, params_kw))


@pytest.mark.parametrize("q_rule", ["drafter_probs", "point_mass"])
def test_the_trap_is_real(small_vocab_drafter, exact, q_rule):
    """Why point masses: the same drafter, sampling drafts in confidence order, with its
    probability at reveal time used as q in the p/q rule (accept with min(1, p/q), resample
    (p - q)+) gives a wrong distribution, and this test's statistic sees it at the same sample
    size; the identical simulation with point-mass q passes. Each draft's q is conditioned on
    drafts revealed before it, which may lie to its right, so it is not q(d_i | prefix, d_<i)."""
    import numpy as np

    from vllm_anyorder.model_executor.masked_diffusion import load_drafter

    drafter = load_drafter(str(small_vocab_drafter), dtype="float32")
    n, gamma, mask = NUM_REQ * N_PER_REQ, 3, drafter.spec.mask_token_id
    gen = torch.Generator().manual_seed(0)
    canvas = torch.tensor([PROMPT + [mask] * gamma] * n)
    q_at_reveal = torch.zeros(n, gamma, drafter.spec.num_tokens)
    with torch.no_grad():
        for _ in range(gamma):  # T = gamma: one position revealed per step
            still = canvas[:, len(PROMPT):] == mask
            probs = torch.softmax(drafter.token_logits(canvas, still.float().mean(1))[:, len(PROMPT):], -1)
            tokens = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=gen).view(n, gamma)
            conf = probs.gather(-1, tokens[..., None])[..., 0].masked_fill(~still, -1.0)
            pick = conf.argmax(1)  # most confident still-masked position
            rows = torch.arange(n)
            canvas[rows, len(PROMPT) + pick] = tokens[rows, pick]
            q_at_reveal[rows, pick] = probs[rows, pick]
    drafts, q = canvas[:, len(PROMPT):].numpy(), q_at_reveal.double().numpy()
    if q_rule == "point_mass":
        q = np.eye(drafter.spec.num_tokens)[drafts]
    rng = np.random.default_rng(0)
    cache = {}

    def probs_of(prefix):
        key = tuple(prefix)
        if key not in cache:
            cache[key] = truncated_probs(exact(key), temperature=1.0)
        return cache[key]

    samples = []
    for row in range(n):
        seq = []
        for i in range(gamma):
            p, d = probs_of(seq), drafts[row, i]
            if rng.random() < min(1.0, p[d] / q[row, i, d]):
                seq.append(int(d))
                continue
            resid = np.maximum(p - q[row, i], 0.0)
            seq.append(int(rng.choice(len(p), p=resid / resid.sum())))
            break
        while len(seq) < MAX_TOKENS:
            seq.append(int(rng.choice(16, p=probs_of(seq))))
        samples.append(tuple(seq))
    worst = min(conditional_chisquare(samples, pos, probs_of)[2] for pos in range(gamma))
    assert (worst < P_MIN) == (q_rule == "drafter_probs"), f"worst p-value {worst:.2e}"
