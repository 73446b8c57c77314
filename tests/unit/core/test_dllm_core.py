"""dLLM block decoding core: schedule and seeded rule, baseline == plain reference decoders,
SSD and FreeDave == baseline token for token with never more forwards, EOS, protocol."""

import math
from dataclasses import replace

import pytest
import torch

from reference.dllm_reference import (
    blockcausal_decode, cached_decode, nocache_decode, step_counts,
)
from vllm_anyorder.core.dllm import DllmRequest, generate
from vllm_anyorder.core.dllm_blocks import (
    DllmSettings, Step, decide, schedule, uniform,
)
from vllm_anyorder.model_executor.dream import DreamConfig, random_dream
from vllm_anyorder.model_executor.llada import LLaDAConfig, random_llada

MASK = 63
PROMPTS = [[5, 9, 12], [7, 3, 3, 20, 41, 2], [11], [30, 31, 32, 33]]
SEEDS = [1, 2, 3, 4]
# (block_length, steps_per_block, temperature, remasking, max_tokens)
CONFIGS = {
    "b4s4-greedy": (4, 4, 0.0, "low_confidence", 16),
    "b8s4-random": (8, 4, 0.0, "random", 16),
    "b4s2-t1-random-short-last": (4, 2, 1.0, "random", 14),
    "b6s6-t0.7": (6, 6, 0.7, "low_confidence", 15),
    "b4s8-zero-steps": (4, 8, 0.0, "low_confidence", 12),
}
METHODS = {
    "ssd-N3": dict(method="ssd", draft_length=3),
    "ssd-N5-mix": dict(method="ssd", draft_length=5, mix_order=True),
    "freedave-d2": dict(method="freedave", draft_steps=2),
    "freedave-d8": dict(method="freedave", draft_steps=8),
}


@pytest.fixture(scope="module")
def models():
    lc = LLaDAConfig(d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, mlp_hidden_size=64,
                     vocab_size=64, embedding_size=64, mask_token_id=MASK, eos_token_id=1,
                     pad_token_id=1)
    dc = DreamConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, mask_token_id=MASK,
                     eos_token_id=1, bos_token_id=1, pad_token_id=1)
    return {"llada": random_llada(lc, seed=0, std=0.3), "dream": random_dream(dc, seed=0, std=0.3)}


def settings(config: str, **kw) -> DllmSettings:
    b, st, t, rm, g = CONFIGS[config]
    return DllmSettings(mask_id=MASK, max_tokens=g, block_length=b, steps_per_block=st,
                        temperature=t, remasking=rm, **kw)


# ------------------------------------------------------------------------ schedule and rule
def test_schedule_follows_llada_transfer_counts_and_skips_empty_steps():
    s = DllmSettings(mask_id=MASK, max_tokens=10, block_length=4, steps_per_block=3)
    assert [(st.index, st.block, st.count) for st in schedule(s)] == [
        (0, 0, 2), (1, 0, 1), (2, 0, 1), (3, 1, 2), (4, 1, 1), (5, 1, 1), (6, 2, 1), (7, 2, 1)]
    s = DllmSettings(mask_id=MASK, max_tokens=3, block_length=3, steps_per_block=5)
    assert [(st.index, st.count) for st in schedule(s)] == [(0, 1), (1, 1), (2, 1)]
    assert step_counts(5, 3) == [2, 2, 1] and step_counts(3, 5) == [1, 1, 1, 0, 0]


def test_draws_are_keyed_by_seed_step_and_position_only():
    pos = torch.tensor([3, 7, 11])
    u = uniform(5, 1, 2, pos, 10)
    assert u.shape == (3, 10) and bool(((u > 0) & (u < 1)).all())
    assert torch.equal(uniform(5, 1, 2, pos[1:], 10), u[1:])  # a subset draws the same
    assert torch.equal(uniform(5, 1, 2, pos, 4), u[:, :4])
    for other in (uniform(6, 1, 2, pos, 10), uniform(5, 1, 3, pos, 10), uniform(5, 2, 2, pos, 10)):
        assert not torch.equal(other, u)
    many = uniform(0, 1, 0, torch.arange(200), 50)
    assert abs(float(many.mean()) - 0.5) < 0.01 and many.unique().numel() > 9990


def test_decide_literal_cases():
    s = DllmSettings(mask_id=4, max_tokens=8)
    logits = torch.tensor([[0.0, 3.0, 0.0, 0.0, 9.0],  # the mask token (4) is never chosen
                           [5.0, 0.0, 0.0, 0.0, 0.0],
                           [0.0, 0.0, 5.0, 0.0, 0.0]])
    pos = torch.tensor([1, 2, 6])
    d = decide(logits, pos, Step(0, 0, 2), s, seed=0)
    assert d.positions == (2, 6) and d.tokens == (0, 2)  # equal confidence: lower position
    d = decide(logits, pos, Step(0, 0, 1), s, seed=0)
    assert d.positions == (2,) and d.tokens == (0,)
    rs = replace(s, remasking="random")  # positions by the seeded draw, tokens by argmax
    want = int(pos[uniform(9, 0x3C6EF372, 3, pos).argmax()])
    d = decide(logits, pos, Step(3, 0, 1), rs, seed=9)
    assert d.positions == (want,)
    hot = replace(s, temperature=1.0)  # sampling: varies with the step, fixed per (seed, step)
    draws = {decide(logits, pos, Step(t, 0, 3), hot, seed=1).tokens for t in range(40)}
    assert len(draws) > 1 and all(tok[0] != 4 for tok in draws)
    assert decide(logits, pos, Step(7, 0, 3), hot, 1) == decide(logits, pos, Step(7, 0, 3), hot, 1)


def test_settings_are_validated():
    with pytest.raises(ValueError):
        DllmSettings(mask_id=MASK, max_tokens=8, remasking="entropy")
    with pytest.raises(ValueError):
        DllmSettings(mask_id=MASK, max_tokens=8, method="jacobi")
    with pytest.raises(ValueError):
        DllmSettings(mask_id=MASK, max_tokens=8, eos_id=MASK)
    with pytest.raises(ValueError):
        DllmRequest([], DllmSettings(mask_id=MASK, max_tokens=8))


# ------------------------------------------------------------------------ baseline
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("name", ["llada", "dream"])
def test_stepwise_equals_the_plain_reference_decoders(models, name, config):
    m, s = models[name], settings(config)
    for cache, refs in (("none", [nocache_decode]),
                        ("prefix", [cached_decode, blockcausal_decode])):
        outs = generate(m, PROMPTS, s, SEEDS, cache=cache)
        for out, prompt, seed in zip(outs, PROMPTS, SEEDS):
            for ref in refs:
                assert ref(m, prompt, s, seed) == (out.tokens, out.forwards), (cache, ref)
            assert out.forwards == len(schedule(s)) and len(out.tokens) == s.max_tokens


# ------------------------------------------------------------------------ SSD and FreeDave
@pytest.mark.parametrize("config", ["b4s4-greedy", "b8s4-random", "b4s2-t1-random-short-last",
                                    "b6s6-t0.7"])
@pytest.mark.parametrize("cache", ["prefix", "none"])
@pytest.mark.parametrize("name", ["llada", "dream"])
def test_ssd_and_freedave_decode_exactly_like_stepwise(models, name, cache, config):
    m = models[name]
    base = generate(m, PROMPTS, settings(config), SEEDS, cache=cache)
    saved = 0
    for label, kw in METHODS.items():
        outs = generate(m, PROMPTS, settings(config, **kw), SEEDS, cache=cache)
        for b, o in zip(base, outs):
            assert o.tokens == b.tokens, label
            assert o.forwards <= b.forwards and o.steps == b.steps, label
            saved += b.forwards - o.forwards
    assert saved > 0  # drafts do get accepted on these models


@pytest.mark.parametrize("method", list(METHODS))
def test_a_request_decodes_the_same_alone_and_in_a_batch(models, method):
    for name in ("llada", "dream"):
        s = settings("b6s6-t0.7", **METHODS[method])
        batch = generate(models[name], PROMPTS, s, SEEDS)
        for i in (0, 3):
            alone = generate(models[name], [PROMPTS[i]], s, [SEEDS[i]])[0]
            assert alone == batch[i]


@pytest.mark.parametrize("lookahead", [0, 2])
def test_any_lookahead_decodes_the_same(models, lookahead):
    s = settings("b4s4-greedy")
    base = generate(models["dream"], PROMPTS, s, SEEDS)
    for kw in (METHODS["ssd-N5-mix"], METHODS["freedave-d8"]):
        outs = generate(models["dream"], PROMPTS, replace(s, lookahead_blocks=lookahead, **kw),
                        SEEDS)
        assert [o.tokens for o in outs] == [b.tokens for b in base]
        assert all(o.forwards <= b.forwards for o, b in zip(outs, base))


def test_zero_drafts_are_the_baseline(models):
    s = settings("b4s4-greedy")
    base = generate(models["llada"], PROMPTS, s, SEEDS)
    for kw in (dict(method="ssd", draft_length=0), dict(method="freedave", draft_steps=1)):
        assert generate(models["llada"], PROMPTS, replace(s, **kw), SEEDS) == base


@pytest.mark.parametrize("name", ["llada", "dream"])
def test_output_ends_at_the_first_eos(models, name):
    s = settings("b4s4-greedy")
    free = generate(models[name], PROMPTS, s, SEEDS)
    eos = free[0].tokens[5]  # a token this request does produce
    for kw in [{}, *METHODS.values()]:
        outs = generate(models[name], PROMPTS, replace(s, eos_id=eos, **kw), SEEDS)
        for f, o in zip(free, outs):
            if eos in f.tokens:
                cut = f.tokens.index(eos) + 1
                assert o.tokens == f.tokens[:cut] and o.finish_reason == "stop"
            else:
                assert o.tokens == f.tokens and o.finish_reason == "length"
            assert o.forwards <= o.steps <= f.steps
        assert outs[0].forwards < free[0].forwards  # the EOS request stopped early
    ref = nocache_decode(models[name], PROMPTS[0], replace(s, eos_id=eos), SEEDS[0])
    want = generate(models[name], PROMPTS[:1], replace(s, eos_id=eos), SEEDS[:1], cache="none")
    assert ref == (want[0].tokens, want[0].forwards)


# ------------------------------------------------------------------------ forward counts
class PositionModel:
    """Logits that depend only on the position (the model interface, no real KV): every
    draft is right, so the counts are exactly 1 + ceil((steps - 1) / k)."""

    logit_shift = 0

    def __init__(self, vocab=64, prompt_len=0, order=None):
        self.vocab, self.prompt_len, self.order = vocab, prompt_len, order

    def forward(self, tokens, positions, past_kv=None, attn_mask=None, shift=True):
        b, n = tokens.shape
        pref = -positions.double()  # default: lower positions are more confident
        if self.order is not None:  # a preferred position per number of decoded ones
            done = ((tokens != MASK) & (positions >= self.prompt_len)).sum(1, keepdim=True)
            want = torch.tensor([self.order.get(int(k), -1) for k in done[:, 0]])[:, None]
            pref = torch.where(positions - self.prompt_len == want, 10.0, pref)
        logits = torch.zeros(b, n, self.vocab, dtype=torch.float64)
        logits.scatter_(2, (positions % 7 + 2)[..., None], (3 + 0.1 * pref)[..., None])
        kv = (torch.zeros(b, n, 1, 1), torch.zeros(b, n, 1, 1))
        return logits.float(), (kv,)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 6])
def test_counts_when_every_draft_is_right(k):
    s = DllmSettings(mask_id=MASK, max_tokens=16, block_length=8, steps_per_block=8)
    m = PositionModel()
    base = generate(m, [[1, 2]], s)[0]
    assert base.forwards == 16
    ssd = generate(m, [[1, 2]], replace(s, method="ssd", draft_length=k - 1))[0]
    dave = generate(m, [[1, 2]], replace(s, method="freedave", draft_steps=k))[0]
    assert ssd.tokens == dave.tokens == base.tokens
    assert ssd.forwards == dave.forwards == 1 + math.ceil(15 / k)


def test_mix_order_follows_an_out_of_order_step():
    # drafts from the state after step 1 say 1, 2, 3; the baseline then decodes 2 before 1
    s = DllmSettings(mask_id=MASK, max_tokens=8, block_length=4, steps_per_block=4,
                     method="ssd", draft_length=3)
    m = PositionModel(prompt_len=2, order={0: 0, 1: 2, 2: 1, 3: 3})
    base = generate(m, [[1, 2]], replace(s, method="stepwise"), cache="none")[0]
    req = DllmRequest([1, 2], replace(s, mix_order=True))
    from vllm_anyorder.core.dllm_cache import BlockEvaluator
    ev = BlockEvaluator(m, req.s, "none")
    for expect_nodes, expect_steps in ((1, 1), (6, 5)):  # chain 4 + mix 2; then 0,2,1,3,4
        plan = req.plan()
        assert plan.nodes.shape[0] == expect_nodes
        req.advance(ev([(req, plan)])[0])
        assert req.i == expect_steps
    plain = generate(m, [[1, 2]], s, cache="none")[0]
    mixed = generate(m, [[1, 2]], replace(s, mix_order=True), cache="none")[0]
    assert plain.tokens == mixed.tokens == base.tokens
    assert mixed.forwards < plain.forwards <= base.forwards


def test_advance_checks_the_plan():
    s = DllmSettings(mask_id=MASK, max_tokens=8, block_length=4, steps_per_block=4)
    req = DllmRequest([1], s)
    with pytest.raises(ValueError):
        req.advance(torch.zeros(1, 4, 64))  # no plan yet
    plan = req.plan()
    with pytest.raises(ValueError):
        req.advance(torch.zeros(2, 4, 64))  # wrong node count
    req.advance(torch.zeros(1, plan.window[1] - plan.window[0], 64))
    assert req.i == 1 and req.forwards == 1


def test_dllm_core_and_models_never_import_vllm():
    import subprocess
    import sys

    code = ("import sys, vllm_anyorder.core.dllm, vllm_anyorder.core.dllm_cache, "
            "vllm_anyorder.model_executor.llada, vllm_anyorder.model_executor.dream; "
            "bad=[m for m in sys.modules if m=='vllm' or m.startswith('vllm.')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
