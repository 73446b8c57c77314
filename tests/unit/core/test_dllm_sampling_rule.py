"""The dLLM baseline's sampling rule in distribution (``core/dllm_blocks.decide``).

At temperature T > 0 the baseline picks x0 = argmax(l / T + g) with Gumbel noise g =
-log(-log u) from keyed uniforms u; LLaDA's released sampler (``add_gumbel_noise``) picks
argmax(exp(l) / (-log u)^T), the same argmax for the same u (divide the log by T). So:
(1) with the same draws both rules choose the same token at every position; (2) over many
keys the choices follow softmax(l / T) without the mask token (chi-square, 8 000 draws);
(3) the statistic rejects a rule that ignores T, so the test can fail."""

import pytest
import torch

from stats import conditional_chisquare
from vllm_anyorder.core.dllm_blocks import GUMBEL_STREAM, DllmSettings, Step, decide, uniform

MASK, T = 5, 0.7
LOGITS = torch.tensor([[1.0, 0.2, -0.5, 0.8, 0.0, 9.0]])  # the mask (5) is never chosen
N = 8000


def _draws(temperature):
    s = DllmSettings(mask_id=MASK, max_tokens=4, temperature=temperature)
    pos = torch.tensor([2])
    return [decide(LOGITS, pos, Step(t, 0, 1), s, seed=seed).tokens
            for seed in range(N // 400) for t in range(400)]


def _exact(temperature):
    lg = LOGITS[0].double().clone()
    lg[MASK] = float("-inf")
    return torch.softmax(lg / temperature, -1).numpy()


def test_llada_rule_chooses_the_same_token_for_the_same_draws():
    s = DllmSettings(mask_id=MASK, max_tokens=4, temperature=T)
    pos = torch.tensor([2])
    for seed in range(50):
        u = uniform(seed, GUMBEL_STREAM, 3, pos, LOGITS.shape[-1])[0]
        lg = LOGITS[0].double().clone()
        lg[MASK] = float("-inf")
        llada = int((lg.exp() / (-torch.log(u)) ** T).argmax())
        assert decide(LOGITS, pos, Step(3, 0, 1), s, seed).tokens == (llada,)


def test_choices_follow_softmax_over_temperature():
    samples = _draws(T)
    assert all(tok[0] != MASK for tok in samples)
    _, df, p = conditional_chisquare(samples, 0, lambda prefix: _exact(T))
    assert df >= 3 and p > 1e-4, p


@pytest.mark.parametrize("wrong_temperature", [1.0, 0.4])
def test_the_test_rejects_a_rule_with_the_wrong_temperature(wrong_temperature):
    _, _, p = conditional_chisquare(_draws(wrong_temperature), 0, lambda prefix: _exact(T))
    assert p < 1e-4, p
