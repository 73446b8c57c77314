"""Shared set-up of the sampling (distribution) tests: a 16-token random Llama, the exact
conditionals of its weights, and many sampled continuations of one prompt."""

import pytest
import torch

PROMPT = [3, 5, 7, 9, 3, 5]
NUM_REQ, N_PER_REQ, MAX_TOKENS = 700, 4, 4
P_MIN = 1e-4  # per-position significance (outputs are not seeded: see assert_fits)
SETTINGS = [dict(temperature=1.0), dict(temperature=0.8, top_k=6, top_p=0.9)]
SETTING_IDS = ["t1", "t08_topk_topp"]


@pytest.fixture(scope="module")
def small_vocab_llama(tmp_path_factory):
    from tiny_models import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("v16"), vocab_size=16, init_range=0.25, seed=3)


@pytest.fixture(scope="module")
def exact(small_vocab_llama):
    """prefix (tuple of generated ids) -> exact next-token logits after PROMPT + prefix."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(small_vocab_llama, dtype=torch.float32).eval()
    cache = {}

    @torch.no_grad()
    def logits(prefix):
        if prefix not in cache:
            cache[prefix] = model(torch.tensor([PROMPT + list(prefix)])).logits[0, -1].numpy()
        return cache[prefix]

    return logits


def sample(llm, params_kw, num_req=NUM_REQ, seeded=False):
    """``num_req`` x ``N_PER_REQ`` continuations of PROMPT (``seeded``: request i has seed
    N_PER_REQ * i, and vLLM seeds its samples N_PER_REQ * i + j: a generator for each, no two
    alike)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = [SamplingParams(n=N_PER_REQ, max_tokens=MAX_TOKENS, ignore_eos=True,
                             seed=N_PER_REQ * i if seeded else None, **params_kw)
              for i in range(num_req)]
    outs = llm.generate([TokensPrompt(prompt_token_ids=PROMPT)] * num_req, params, use_tqdm=False)
    return [tuple(c.token_ids) for o in outs for c in o.outputs]


def assert_fits(samples, cond, redraw, positions=range(MAX_TOKENS)):
    """Every position of ``samples`` fits the exact conditionals ``cond(prefix)`` (chi-square
    p > P_MIN). A miss is re-tested once on ``samples`` pooled with ``redraw()``: about 40
    such tests per suite run make a correct sampler miss once in a few hundred runs (CI saw
    p = 4.5e-5 once), while a wrong rule still fails, on twice the samples."""
    from stats import conditional_chisquare

    def misses(pool):
        found = []
        for pos in positions:
            stat, df, p = conditional_chisquare(pool, pos, cond)
            assert df > 0
            if p <= P_MIN:
                found.append(f"position {pos}: chi2={stat:.1f} df={df} p={p:.2e}")
        return found

    if misses(samples):
        pooled = list(samples) + list(redraw())
        still = misses(pooled)
        assert not still, f"on {len(pooled)} pooled samples: {still}"
