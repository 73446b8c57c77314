"""The sampled verification rule (``core/sampled_verify``): each committed token is distributed
as plain sampling from the target (chi-square over many draws, a wrong rule fails the same
test), greedy requests take the argmax rule, padded drafts are rejected."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from vllm_anyorder.core import sampled_verify as rule
from vllm_anyorder.core.greedy_verify import PLACEHOLDER

V = 6
TARGET = torch.tensor([[0.40, 0.25, 0.15, 0.10, 0.06, 0.04],   # p_1
                       [0.05, 0.05, 0.50, 0.20, 0.10, 0.10],   # p_2 (the same for any d_1)
                       [0.30, 0.30, 0.10, 0.10, 0.10, 0.10]])  # p_3, the bonus row
SCORES = TARGET.log() + torch.tensor([[1.0], [-2.0], [0.5]])  # log-weights, any shift per row
DRAFT_Q = torch.tensor([[0.10, 0.60, 0.10, 0.10, 0.05, 0.05],
                        [0.20, 0.20, 0.20, 0.20, 0.10, 0.10]])


def committed(num: int, draft_probs: torch.Tensor | None, seed: int = 0, seeded: bool = False):
    """``num`` verifications of two drafts (sampled from q, or fixed to [1, 3] for point
    masses), each stacked with one request (``seeded``: each with its own generator, seeds
    seed * num + i); returns the committed rows."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    if draft_probs is None:
        drafts = torch.tensor([1, 3] * num)
    else:
        drafts = torch.stack([torch.multinomial(draft_probs[j], num, True, generator=gen)
                              for j in range(2)], dim=1).flatten()
    scores = SCORES.repeat(num, 1)
    q = None if draft_probs is None else draft_probs.repeat(num, 1)
    generators = {i: torch.Generator().manual_seed(seed * num + i)
                  for i in range(num)} if seeded else None
    return rule.sampled_verify(drafts, [2] * num, scores, [False] * num, draft_probs=q,
                               generators=generators)


def pvalue(tokens: list[int], p: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(tokens), minlength=V).double()
    return chisquare(counts.numpy(), (p.double() / p.double().sum() * counts.sum()).numpy()).pvalue


def first_token_pvalue(rows) -> float:
    return pvalue([r[0] for r in rows], TARGET[0])


def second_token_pvalue(rows) -> float:
    """Token 2 of the rows that committed two or more (it follows p_2 for any first token)."""
    return pvalue([r[1] for r in rows if r[1] != PLACEHOLDER], TARGET[1])


@pytest.mark.parametrize("q", [None, DRAFT_Q], ids=["point-mass", "draft-probs"])
def test_committed_tokens_follow_the_target(q):
    rows = committed(20000, q)
    assert first_token_pvalue(rows) > 1e-3
    assert second_token_pvalue(rows) > 1e-3
    # rows are drafts accepted in order, then one drawn token, then placeholders
    assert all(len(r) == 3 and PLACEHOLDER not in r[:1] for r in rows)


@pytest.mark.parametrize("q", [None, DRAFT_Q], ids=["point-mass", "draft-probs"])
def test_seeded_requests_follow_the_target_from_their_own_generators(q):
    rows = committed(20000, q, seeded=True)
    assert first_token_pvalue(rows) > 1e-3
    assert second_token_pvalue(rows) > 1e-3


def test_a_seed_reproduces_its_request_whatever_the_global_state_and_the_batch():
    drafts = torch.tensor([1, 3, 0, 2])  # request 0: [1, 3] (seeded), request 1: [0, 2]
    scores = SCORES.repeat(2, 1)
    runs = []
    for global_seed, other in [(0, 0), (1, 1), (2, 1)]:
        torch.manual_seed(global_seed)
        runs.append([rule.sampled_verify(drafts, [2, 2], scores, [False, False], generators={
            0: torch.Generator().manual_seed(seed)})[0] for seed in range(40)])
    assert runs[0] == runs[1] == runs[2]  # the seeded request ignores the global generator
    assert len({tuple(r) for r in runs[0]}) > 3  # and its seed matters


def test_a_seeded_request_without_drafts_takes_one_uniform_from_its_generator():
    generator = torch.Generator().manual_seed(5)
    rule.sampled_verify(torch.tensor([], dtype=torch.int64), [0], SCORES[[0]], [False],
                        generators={0: generator})
    expected = torch.Generator().manual_seed(5)
    torch.rand(1, dtype=torch.float64, generator=expected)
    assert torch.equal(generator.get_state(), expected.get_state())


def test_tokens_the_caller_drew_are_committed_for_requests_without_drafts():
    generator = torch.Generator().manual_seed(5)
    state = generator.get_state()
    out = rule.sampled_verify(torch.tensor([1]), [0, 1], SCORES[[0, 0, 2]], [False, False],
                              uniform=torch.tensor([0.0]), generators={0: generator},
                              drawn={0: 4, 1: 5})  # request 1 has a draft: drawn ignored
    assert out[0] == [4, PLACEHOLDER] and out[1][0] == 1 and out[1][1] != PLACEHOLDER
    assert torch.equal(generator.get_state(), state)  # the caller's draw took its uniforms


def test_a_wrong_residual_fails_the_same_test(monkeypatch):
    # the bug the rule guards against: on rejection, drawing from p instead of (p - q)+
    original = rule._draw

    def from_p(scores, draws, drafts, draft_probs, generators):
        return original(scores, [(i, s, r, -1) for i, s, r, _ in draws], drafts, draft_probs,
                        generators)

    monkeypatch.setattr(rule, "_draw", from_p)
    rows = committed(20000, DRAFT_Q)
    assert first_token_pvalue(rows) < 1e-6


def test_accepting_by_p_alone_fails_the_same_test():
    # accept with probability p(d) instead of p(d) / q(d): wrong whenever q is not uniform
    n = 20000
    torch.manual_seed(1)
    drafts = torch.multinomial(DRAFT_Q[0], n, True)
    u = torch.rand(n, dtype=torch.float64) * DRAFT_Q[0][drafts].double()  # u' = u * q(d)
    rows = rule.sampled_verify(drafts, [1] * n, SCORES[[0, 2]].repeat(n, 1), [False] * n,
                               draft_probs=DRAFT_Q[[0]].repeat(n, 1), uniform=u)
    assert first_token_pvalue(rows) < 1e-6


def test_padded_drafts_are_rejected_and_the_token_is_drawn_from_p():
    n = 20000
    torch.manual_seed(2)
    rows = rule.sampled_verify(torch.tensor([-1, -1] * n), [2] * n, SCORES.repeat(n, 1),
                               [False] * n)
    assert all(r[1:] == [PLACEHOLDER, PLACEHOLDER] for r in rows)
    assert first_token_pvalue(rows) > 1e-3


def test_greedy_requests_take_the_argmax_rule_beside_sampled_ones():
    scores = torch.cat([SCORES, SCORES[[0, 2]]])  # request 0: two drafts; request 1: one
    argmax = scores.argmax(dim=-1).tolist()  # [0, 2, 0, 0, 0]
    out = rule.sampled_verify(torch.tensor([0, 2, 5]), [2, 1], scores, [True, False],
                              argmax=argmax, uniform=torch.tensor([0.0, 0.0, 0.99]))
    assert out[0] == [0, 2, 0]  # both drafts match the argmax: they and the bonus
    assert out[1][0] != 5 and out[1][1:] == [PLACEHOLDER, PLACEHOLDER]  # 0.99 > p(5) / 1


def test_requests_without_drafts_draw_their_bonus_token():
    n = 20000
    torch.manual_seed(3)
    rows = rule.sampled_verify(torch.tensor([], dtype=torch.int64), [0] * n,
                               SCORES[[0]].repeat(n, 1), [False] * n)
    assert all(len(r) == 1 for r in rows)
    assert first_token_pvalue(rows) > 1e-3


def test_truncated_tokens_are_never_accepted_or_drawn():
    n = 5000
    torch.manual_seed(4)
    scores = SCORES[[0, 2]].clone()
    scores[:, 1] = float("-inf")  # token 1 cut by top-k / top-p at both rows
    rows = rule.sampled_verify(torch.tensor([1] * n), [1] * n, scores.repeat(n, 1), [False] * n)
    assert all(r[0] != 1 and r[1] == PLACEHOLDER for r in rows)
    kept = [0, 2, 3, 4, 5]  # the others keep their relative weights
    counts = torch.bincount(torch.tensor([r[0] for r in rows]), minlength=V).double()[kept]
    expected = TARGET[0, kept].double() / TARGET[0, kept].double().sum() * counts.sum()
    assert chisquare(counts.numpy(), expected.numpy()).pvalue > 1e-3


def test_rows_after_a_first_rejection_are_never_read():
    scores = SCORES.clone()
    scores[1] = float("nan")  # d_2's row: a rejection at d_1 must not look at it
    out = rule.sampled_verify(torch.tensor([1, 3]), [2], scores, [False],
                              uniform=torch.tensor([0.999, 0.0], dtype=torch.float64))
    assert out[0][0] != 1 and out[0][1:] == [PLACEHOLDER, PLACEHOLDER]  # 0.999 > p(1)


def test_request_rows_lay_out_targets_then_the_bonus_row():
    assert rule.request_rows([2, 0, 1]) == ([0, 1, 4], [2, 3, 5])
