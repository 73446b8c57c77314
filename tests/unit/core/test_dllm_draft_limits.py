"""Per-round draft limits (the speculation budget's caps) on SSD and FreeDave: whatever limit
each request gets in each round, 0 included, the tokens are the baseline's (greedy and seeded
sampling); limit 0 costs one node per forward like the baseline, and the policy's state stays
warm through it; the draft room reproduces the unlimited plan."""

import random

import pytest

from unit.core.test_dllm_core import MASK, PROMPTS, SEEDS, models  # noqa: F401 (fixture)
from vllm_anyorder.core.dllm import DllmRequest, generate
from vllm_anyorder.core.dllm_blocks import DllmSettings

SETTINGS = {  # (block_length, steps_per_block, temperature, remasking, max_tokens, eos)
    "b4s4-greedy-eos": (4, 4, 0.0, "low_confidence", 16, 1),
    "b8s4-random": (8, 4, 0.0, "random", 16, None),
    "b6s6-t0.8": (6, 6, 0.8, "low_confidence", 15, None),
}
METHODS = {
    "ssd-N4": dict(method="ssd", draft_length=4),
    "ssd-N3-mix": dict(method="ssd", draft_length=3, mix_order=True),
    "freedave-d4": dict(method="freedave", draft_steps=4),
}


def settings(name: str, **kw) -> DllmSettings:
    b, st, t, rm, g, eos = SETTINGS[name]
    return DllmSettings(mask_id=MASK, max_tokens=g, block_length=b, steps_per_block=st,
                        temperature=t, remasking=rm, eos_id=eos, **kw)


class Limits:
    """A random limit per request and round (0 often), recording the limits it gave."""

    def __init__(self, seed: int, choices=(0, 0, 0, 1, 2, 3, 5, None)) -> None:
        self.rng, self.choices = random.Random(seed), choices
        self.given: list[int | None] = []

    def __call__(self, req) -> int | None:
        self.given.append(self.rng.choice(self.choices))
        return self.given[-1]


@pytest.mark.parametrize("config", list(SETTINGS))
@pytest.mark.parametrize("name", ["llada", "dream"])
def test_any_limits_decode_like_stepwise(models, name, config):
    m = models[name]
    base = generate(m, PROMPTS, settings(config), SEEDS)
    for method, kw in METHODS.items():
        for trial in range(3):
            limits = Limits(seed=100 * trial + len(method))
            outs = generate(m, PROMPTS, settings(config, **kw), SEEDS, limit=limits)
            assert 0 in limits.given and any(g is None or g > 1 for g in limits.given)
            for b, o in zip(base, outs):
                assert o.tokens == b.tokens and o.finish_reason == b.finish_reason, method
                assert o.steps == b.steps and o.forwards <= b.forwards, method


@pytest.mark.parametrize("method", list(METHODS))
def test_limit_zero_costs_what_stepwise_costs(models, method):
    m, s = models["llada"], settings("b4s4-greedy-eos", **METHODS[method])
    base = generate(m, PROMPTS, settings("b4s4-greedy-eos"), SEEDS)
    outs = generate(m, PROMPTS, s, SEEDS, limit=lambda r: 0)
    for b, o in zip(base, outs):
        assert o.tokens == b.tokens
        assert o.nodes == o.forwards  # one node per forward, as the baseline
        # FreeDave skips the last forward where X^1 is certain; SSD is the baseline exactly
        assert o.forwards == b.forwards if method.startswith("ssd") else o.forwards <= b.forwards


@pytest.mark.parametrize("method", list(METHODS))
def test_drafting_resumes_warm_after_rounds_without_drafts(models, method):
    """Limit 0 for the first rounds, then unlimited: the drafts of the first drafting round
    come from logits kept through the undrafted rounds, so forwards are still saved."""
    m, s = models["dream"], settings("b8s4-random", **METHODS[method])
    base = generate(m, PROMPTS, settings("b8s4-random"), SEEDS)
    rounds: dict[int, int] = {}

    def limit(req):
        rounds[id(req)] = rounds.get(id(req), 0) + 1
        return 0 if rounds[id(req)] <= 3 else None

    outs = generate(m, PROMPTS, s, SEEDS, limit=limit)
    assert [o.tokens for o in outs] == [b.tokens for b in base]
    assert sum(b.forwards - o.forwards for b, o in zip(base, outs)) > 0


@pytest.mark.parametrize("method", list(METHODS))
def test_room_is_the_configured_plan(models, method):
    """``plan(draft_room())`` == ``plan()``: the budget's ``fixed`` mode changes nothing; and a
    plan never drafts more than its limit."""
    m, s = models["llada"], settings("b6s6-t0.8", **METHODS[method])
    seen = []

    def room(req):
        seen.append(req.draft_room())
        return seen[-1]

    assert generate(m, PROMPTS, s, SEEDS, limit=room) == generate(m, PROMPTS, s, SEEDS)
    assert max(seen) == (s.draft_length if s.method == "ssd" else s.draft_steps - 1)
    assert seen.count(0) >= len(PROMPTS)  # the first round of every request cannot draft


@pytest.mark.parametrize("method", list(METHODS))
def test_plans_respect_the_limit_and_count_their_drafts(models, method, monkeypatch):
    s = settings("b4s4-greedy-eos", **METHODS[method])
    plans = []
    real = DllmRequest.plan

    def spy(req, limit=None):
        plan = real(req, limit)
        if plan is not None:
            plans.append((limit, plan.drafted, plan.nodes.shape[0]))
        return plan

    monkeypatch.setattr(DllmRequest, "plan", spy)
    generate(models["llada"], PROMPTS, s, SEEDS, limit=Limits(seed=7))
    assert any(n > 0 for _, n, _ in plans)
    for lim, n, nodes in plans:
        assert 0 <= n <= (lim if lim is not None else 4)
        assert nodes == n + 1 if not s.mix_order else nodes >= n + 1  # node 0 + the drafts


@pytest.mark.parametrize("method", list(METHODS))
def test_a_forward_computes_only_the_blocks_drafts_read(models, method, monkeypatch):
    """A plan's logit window (what its forward computes) holds its nodes' blocks, plus the next
    block only where the next round's drafts reach it: at limit 0 never (the baseline's
    window), unlimited only near a block's end."""
    s = settings("b8s4-random", **METHODS[method])
    windows = {0: [], None: []}
    real = DllmRequest.plan

    def spy(req, limit=None):
        plan = real(req, limit)
        if plan is not None and req.draft_room():
            windows[limit].append(plan.window[1] - plan.window[0])
        return plan

    monkeypatch.setattr(DllmRequest, "plan", spy)
    for limit in windows:
        generate(models["llada"], PROMPTS, s, SEEDS, limit=lambda r, lim=limit: lim)
    assert windows[0] and set(windows[0]) == {s.block_length}
    assert 2 * s.block_length in windows[None] and s.block_length in windows[None]
