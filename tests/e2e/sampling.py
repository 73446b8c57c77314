"""Shared set-up of the sampling (distribution) tests: a 16-token random Llama, the exact
conditionals of its weights, and many sampled continuations of one prompt."""

import pytest
import torch

PROMPT = [3, 5, 7, 9, 3, 5]
NUM_REQ, N_PER_REQ, MAX_TOKENS = 700, 4, 4
P_MIN = 1e-4  # per-position significance; outputs are seeded, so the run is reproducible
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


def sample(llm, params_kw, num_req=NUM_REQ):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(n=N_PER_REQ, max_tokens=MAX_TOKENS, ignore_eos=True, seed=None,
                            **params_kw)
    outs = llm.generate([TokensPrompt(prompt_token_ids=PROMPT)] * num_req, params, use_tqdm=False)
    return [tuple(c.token_ids) for o in outs for c in o.outputs]
