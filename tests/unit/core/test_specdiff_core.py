"""core.specdiff: batched masked-diffusion drafting against the one-request reference."""

import pytest
import torch

from reference.specdiff_reference import reference_draft
from vllm_anyorder.core.specdiff import SCHEDULES, SpecDiffSettings, draft, reveal_counts

V, MASK, D = 12, 12, 16


class FakeDenoiser:
    """Tiny fixed attention model over real keys only (pads excluded), fp64 so scores are
    tie-free; records every call."""

    def __init__(self, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.randn(V + 1, D, generator=g, dtype=torch.float64)
        self.pos = torch.randn(64, D, generator=g, dtype=torch.float64)
        self.out = torch.randn(D, V, generator=g, dtype=torch.float64) * 3
        self.t_bias = torch.randn(V, generator=g, dtype=torch.float64)
        self.calls = []

    def __call__(self, tokens, t, key_mask):
        self.calls.append((tokens.clone(), t.clone(), key_mask.clone()))
        h = self.emb[tokens] + self.pos[: tokens.shape[1]]
        att = (h @ h.transpose(1, 2)) / D**0.5
        att = att.masked_fill(~key_mask[:, None, :], float("-inf")).softmax(-1)
        return (att @ h) @ self.out + t[:, None, None].double() * self.t_bias


def settings(gamma=6, steps=3, schedule="confidence", temperature=0.0):
    return SpecDiffSettings(num_draft_tokens=gamma, steps=steps, context_window=32,
                            schedule=schedule, temperature=temperature)


@pytest.mark.parametrize("gamma,steps", [(1, 1), (6, 1), (6, 4), (7, 3), (16, 16), (32, 5)])
def test_reveal_counts_split_gamma_evenly_over_T_steps(gamma, steps):
    counts = reveal_counts(gamma, steps)
    assert len(counts) == steps and sum(counts) == gamma
    assert max(counts) - min(counts) <= 1 and counts == sorted(counts, reverse=True)


CONTEXTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [0], [11, 11, 2, 5]]


@pytest.mark.parametrize("schedule", ["confidence", "left_to_right"])
@pytest.mark.parametrize("gamma,steps", [(6, 3), (5, 5), (8, 1), (7, 2)])
def test_batched_drafts_equal_the_one_request_reference(schedule, gamma, steps):
    den = FakeDenoiser()
    drafts, forwards = draft(den, CONTEXTS, settings(gamma, steps, schedule), MASK)
    assert forwards == steps
    for ctx, got in zip(CONTEXTS, drafts):
        assert got == reference_draft(FakeDenoiser(), ctx, gamma, steps, schedule, MASK)


def test_random_schedule_equals_the_reference_given_the_same_priorities():
    gamma, steps = 6, 3
    gen = torch.Generator().manual_seed(5)
    drafts, _ = draft(FakeDenoiser(), CONTEXTS, settings(gamma, steps, "random"), MASK, gen)
    replay = torch.Generator().manual_seed(5)
    per_step = [torch.rand((len(CONTEXTS), gamma), generator=replay) for _ in range(steps)]
    for row, ctx in enumerate(CONTEXTS):
        want = reference_draft(FakeDenoiser(), ctx, gamma, steps, "random", MASK,
                               random_priorities=lambda s: per_step[s][row].tolist())
        assert drafts[row] == want


def test_one_forward_per_step_covers_the_whole_batch_with_pads_excluded():
    den = FakeDenoiser()
    gamma, steps = 4, 2
    draft(den, CONTEXTS, settings(gamma, steps), MASK)
    assert len(den.calls) == steps
    tokens, t, key_mask = den.calls[0]
    assert tokens.shape == (len(CONTEXTS), max(map(len, CONTEXTS)) + gamma)
    assert key_mask.sum(1).tolist() == [len(c) + gamma for c in CONTEXTS]
    assert t.tolist() == [1.0] * len(CONTEXTS)
    assert den.calls[1][1].tolist() == [0.5] * len(CONTEXTS)  # half of the window revealed
    for row, ctx in enumerate(CONTEXTS):  # context untouched, window all masks at first
        assert tokens[row, : len(ctx)].tolist() == ctx
        assert tokens[row, len(ctx) : len(ctx) + gamma].tolist() == [MASK] * gamma


def test_revealed_positions_are_never_changed_and_each_step_reveals_its_share():
    den = FakeDenoiser(seed=3)
    gamma, steps = 7, 3
    drafts, _ = draft(den, CONTEXTS, settings(gamma, steps), MASK)
    windows = [c[0][:, :] for c in den.calls]
    counts = reveal_counts(gamma, steps)
    for row, ctx in enumerate(CONTEXTS):
        seen = [w[row, len(ctx) : len(ctx) + gamma].tolist() for w in windows] + [drafts[row]]
        for step in range(steps):
            before, after = seen[step], seen[step + 1]
            newly = [g for g in range(gamma) if before[g] == MASK and after[g] != MASK]
            assert len(newly) == counts[step]
            assert all(before[g] == after[g] for g in range(gamma) if before[g] != MASK)


def test_confidence_schedule_reveals_the_most_confident_positions_first():
    gamma = 4
    scores = torch.zeros(1, 2 + gamma, V)
    for g, margin in enumerate([1.0, 5.0, 2.0, 9.0]):
        scores[0, 2 + g, g] = margin
    drafts, _ = draft(lambda tok, t, km: scores.clone(), [[0, 1]], settings(gamma, 2), MASK)
    assert drafts == [[0, 1, 2, 3]]
    seen = []

    def spy(tok, t, km):
        seen.append(tok[0, 2:].tolist())
        return scores.clone()

    draft(spy, [[0, 1]], settings(gamma, 2), MASK)
    assert seen[1] == [MASK, 1, MASK, 3]  # positions 1 and 3 (margins 5, 9) came first


def test_temperature_sampling_follows_the_tempered_drafter_distribution():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0] + [-30.0] * (V - 4))
    scores = logits.expand(1, 1 + 1, V).clone()
    gen = torch.Generator().manual_seed(0)
    n, temp = 4000, 0.7
    counts = torch.zeros(V)
    for _ in range(n):
        (d,), _ = draft(lambda tok, t, km: scores, [[0]], settings(1, 1, temperature=temp),
                        MASK, gen)
        counts[d[0]] += 1
    want = torch.softmax(logits / temp, -1)
    from scipy.stats import chisquare

    assert chisquare(counts[:4].numpy(), (want[:4] * n / want[:4].sum()).numpy()).pvalue > 1e-3
    assert chisquare(counts[:4].numpy(), (torch.softmax(logits, -1)[:4] * n /
                     torch.softmax(logits, -1)[:4].sum()).numpy()).pvalue < 1e-3


def test_schedule_table_matches_the_config_choices():
    from vllm_anyorder.config import UNMASK_SCHEDULES

    assert set(SCHEDULES) == set(UNMASK_SCHEDULES)


def test_empty_batch_runs_no_forward():
    den = FakeDenoiser()
    assert draft(den, [], settings(), MASK) == ([], 0) and not den.calls


@pytest.mark.parametrize("gamma,steps,depth,want_steps", [
    (16, 4, 16, 4), (16, 4, 4, 1), (16, 4, 5, 2), (16, 4, 1, 1), (6, 6, 3, 3), (8, 1, 8, 1)])
def test_a_shallower_budget_drafts_fewer_masks_at_the_configured_pace(gamma, steps, depth,
                                                                      want_steps):
    s = settings(gamma=gamma, steps=steps).for_depth(depth)
    assert (s.num_draft_tokens, s.steps) == (depth, want_steps)
    assert s.context_window == 32 and s.schedule == "confidence"
    denoiser = FakeDenoiser()
    drafts, forwards = draft(denoiser, [[1, 2, 3], [4, 5]], s, MASK)
    assert forwards == want_steps == len(denoiser.calls)
    assert all(len(d) == depth for d in drafts)
    assert denoiser.calls[0][0].shape[1] == 3 + depth  # the canvas is W + depth wide


def test_the_full_depth_is_the_configured_drafting_unchanged():
    s = settings(gamma=6, steps=3)
    assert s.for_depth(6) == s and s.for_depth(99) == s
