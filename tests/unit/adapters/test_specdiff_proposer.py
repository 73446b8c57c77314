"""SpecDiffProposer against fake engine objects: it cuts each request's context window out of
the runner's token buffer, drafts for the whole batch at once with the core, and returns
request-major chains (none for partial prefill chunks, truncated at max_model_len).

Fakes: vllm_config (speculative_config.num_speculative_tokens, model_config.max_model_len,
additional_config resolved by config.store), a tiny random MDLM drafter written to disk, a
"target" module whose only use is its device, token_ids numpy [max_reqs, max_len]."""

from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch

from vllm_anyorder import config
from vllm_anyorder.config import SpecDiffConfig
from vllm_anyorder.core.specdiff import SpecDiffSettings, draft
from vllm_anyorder.model_executor.masked_diffusion import load_drafter, mdlm_spec, random_drafter, save_drafter
from vllm_anyorder.proposers.specdiff import SpecDiffProposer

V, MAX_LEN, PAD = 64, 200, 63


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("drafter")
    spec = mdlm_spec(vocab_size=V + 1, hidden_size=64, cond_dim=32, n_blocks=2, n_heads=2,
                     max_length=48)
    save_drafter(random_drafter(spec, seed=4, init_std=0.3), path)
    return str(path)


def make_proposer(drafter_dir, gamma=6, max_model_len=MAX_LEN, **options):
    additional = {}
    cfg = SpecDiffConfig(**{"drafter": drafter_dir, "num_draft_tokens": gamma, "steps": 3,
                            "dtype": "float32", "budget": "fixed", **options})
    config.store(additional, "specdiff", cfg)
    vllm_config = NS(speculative_config=NS(num_speculative_tokens=gamma),
                     model_config=NS(max_model_len=max_model_len), additional_config=additional)
    p = SpecDiffProposer(vllm_config)
    p.load_model(torch.nn.Linear(2, 2))  # the target: only its device is used
    return p


def token_buffer(contexts):
    buf = np.full((len(contexts) + 2, MAX_LEN), PAD, dtype=np.int64)
    for i, ctx in enumerate(contexts):
        buf[i, : len(ctx)] = ctx
    return buf


CONTEXTS = [list(range(3, 13)), [5, 9, 11], [7] * 30, list(range(40))]


def test_window_defaults_to_the_drafters_length_minus_gamma(drafter_dir):
    p = make_proposer(drafter_dir, gamma=6)
    assert p.settings == SpecDiffSettings(num_draft_tokens=6, steps=3, context_window=42,
                                          schedule="confidence", temperature=0.0)
    assert make_proposer(drafter_dir, context_window=5).settings.context_window == 5


def test_drafts_equal_the_core_on_each_requests_window(drafter_dir):
    p = make_proposer(drafter_dir, gamma=6, context_window=20)
    chains = p.propose([[1]] * 4, np.array([len(c) for c in CONTEXTS]), token_buffer(CONTEXTS))
    model = load_drafter(drafter_dir, dtype="float32")
    want, _ = draft(lambda t, s, m: model.token_logits(t, s, m), [c[-20:] for c in CONTEXTS],
                    p.settings, model.spec.mask_token_id)
    assert chains == want and all(len(c) == 6 for c in chains)
    assert p.drafter_forwards == 3 and p.drafter_calls == 1  # T forwards for the whole batch


def test_partial_prefill_gets_no_drafts_and_costs_nothing(drafter_dir):
    p = make_proposer(drafter_dir)
    chains = p.propose([[], [4], []], np.array([10, 3, 30]), token_buffer(CONTEXTS[:3]))
    assert chains[0] == [] and chains[2] == [] and len(chains[1]) == 6
    assert p.propose([[], []], np.array([10, 3]), token_buffer(CONTEXTS[:2])) == [[], []]
    assert p.drafter_calls == 1 and p.drafter_forwards == 3


def test_chains_never_run_past_max_model_len(drafter_dir):
    p = make_proposer(drafter_dir, gamma=6, max_model_len=43)
    chains = p.propose([[1], [1]], np.array([40, 43]), token_buffer([list(range(40)), list(range(43))]))
    assert len(chains[0]) == 3 and chains[1] == []


def test_drafts_are_drafter_tokens_never_the_mask(drafter_dir):
    p = make_proposer(drafter_dir, gamma=8, schedule="random", temperature=1.5)
    chains = p.propose([[1]] * 4, np.array([len(c) for c in CONTEXTS]), token_buffer(CONTEXTS))
    assert all(0 <= t < V for c in chains for t in c)


def test_same_seed_same_drafts_on_every_rank(drafter_dir):
    """TP ranks each run a proposer: with the same seed and step they must agree."""
    runs = []
    for _ in range(2):
        p = make_proposer(drafter_dir, gamma=8, schedule="random", temperature=1.0, seed=7)
        ctx = np.array([len(c) for c in CONTEXTS])
        runs.append([p.propose([[1]] * 4, ctx, token_buffer(CONTEXTS)) for _ in range(3)])
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[0][1]  # the step counter moves the generator on


def test_the_drafter_drafts_only_as_deep_as_the_budget_allows(drafter_dir):
    """budget cycle:2 caps every chain at 2 of gamma 6: one forward (3 steps x 2/6) over a
    canvas 4 columns narrower, instead of 3 forwards and truncation."""
    p = make_proposer(drafter_dir, gamma=6, budget="cycle:2")
    chains = p.propose([[1]] * 4, np.array([len(c) for c in CONTEXTS]), token_buffer(CONTEXTS))
    assert [len(c) for c in chains] == [2] * 4
    assert p.drafter_forwards == 1 and p.drafter_calls == 1


def test_the_budget_prices_each_depth_by_its_drafter_forwards(drafter_dir):
    """gamma 6, T 3: depths 1-2 run one drafter forward, 3-4 two, 5-6 three; the budget's
    cost model keeps one arm per forward count (core/budget_models.StepCost)."""
    p = make_proposer(drafter_dir, gamma=6)
    assert [p.budget.controller.stages(d) for d in range(1, 7)] == [1, 1, 2, 2, 3, 3]
