"""The sampled verification rule of speculative decoding, on tensors (engine-free).

Leviathan et al. 2023, Algorithm 1 (Chen et al. 2023, Algorithm 2), as vLLM's rejection
sampler applies it at temperature > 0 (``v1/sample/rejection_sampler.py``): a request's drafts
d_1..d_n were proposed from q_1..q_n (a point mass at d_j where the proposer gave no
probabilities) and are checked in order against the target's p_1..p_n (temperature, top-k and
top-p applied):

- d_j is accepted with probability min(1, p_j(d_j) / q_j(d_j)) (line 5: u_j <= p / q, with
  u_j ~ U[0, 1); a padded draft, -1, and a draft q gave no mass are rejected);
- at the first rejection j the step commits d_1..d_{j-1} and one token drawn from
  norm((p_j - q_j)+) (line 7; for a point mass that is p_j with d_j's mass removed);
- when all n are accepted it commits them and a bonus token drawn from p_{n+1} (line 6).

Each committed token is then distributed exactly as plain sampling from the target would draw
it. A greedy request (temperature 0) takes the argmax rule of ``core/greedy_verify``. Draws
are by inverse CDF (:func:`inverse_cdf`; vLLM's kernels race exponentials, the same
distribution). A seeded request (its own ``torch.Generator``, as vLLM keeps one per request
with a ``seed``) takes every uniform it needs from that generator, so its output depends on
its seed and its drafts only, never on the rest of the batch; a seeded request without drafts
can be drawn by the caller (``drawn``: vLLM draws it as on a step without drafts, so whether
the rest of the batch drafted does not change its output). ``patches/cpu_kernels`` runs this for CPU steps in place of vLLM's kernel
path (issue 22): same distribution, fewer passes over the vocabulary.
"""

from __future__ import annotations

import torch

from .greedy_verify import PLACEHOLDER, greedy_verify


def request_rows(num_drafts: list[int]) -> tuple[list[int], list[int]]:
    """Row indices into a step's logits ([sum(n + 1), V], request-major: each request's n
    draft-verifying rows, then its bonus row): (target rows [sum(n)], bonus rows [batch])."""
    target, bonus, start = [], [], 0
    for n in num_drafts:
        target.extend(range(start, start + n))
        bonus.append(start + n)
        start += n + 1
    return target, bonus


def sampled_verify(drafts: torch.Tensor, num_drafts: list[int], probs: torch.Tensor,
                   greedy: list[bool], argmax: list[int] | None = None,
                   draft_probs: torch.Tensor | None = None,
                   uniform: torch.Tensor | None = None,
                   target_rows: list[int] | None = None,
                   bonus_rows: list[int] | None = None,
                   generators: dict[int, torch.Generator] | None = None,
                   drawn: dict[int, int] | None = None) -> list[list[int]]:
    """Each request's committed tokens, padded with :data:`PLACEHOLDER` to max(n) + 1.

    ``drafts``: [sum(n)] int, request-major; ``probs``: [sum(n + 1), V] float32, the target's
    sampling distribution at every row (layout of :func:`request_rows`); ``greedy``: [batch]
    requests verified by argmax, whose rows' argmax is ``argmax`` [sum(n + 1)] (needed only
    when some request is greedy); ``draft_probs``: [sum(n), V] the q each draft came from, or
    None (point masses); ``uniform``: [sum(n)] float64 U[0, 1) draws (drawn here if None);
    ``target_rows`` / ``bonus_rows``: where each draft's and each request's bonus row sit in
    ``probs`` (default: the layout of :func:`request_rows`); ``generators``: request index ->
    its generator, for seeded requests (vLLM's ``SamplingMetadata.generators``); ``drawn``:
    request -> its token, for sampled requests without drafts whose token the caller drew."""
    width = max(num_drafts, default=0) + 1
    if target_rows is None or bonus_rows is None:
        target_rows, bonus_rows = request_rows(num_drafts)
    vocab = probs.shape[1]
    drafted: list[int] = drafts.tolist()
    accepted: list[bool] = []
    if drafted:  # line 5 for every draft: u <= p(d) / q(d), i.e. u * q(d) <= p(d)
        flat = probs.reshape(-1)
        p = flat[torch.tensor([r * vocab + max(d, 0) for r, d in zip(target_rows, drafted)])]
        q = [1.0] * len(drafted) if draft_probs is None else draft_probs.reshape(-1)[
            torch.tensor([j * vocab + max(d, 0) for j, d in enumerate(drafted)])].tolist()
        u = _uniform(num_drafts, generators or {}) if uniform is None else uniform
        accepted = [d >= 0 and qd > 0 and ud * qd <= pd
                    for d, pd, qd, ud in zip(drafted, p.tolist(), q, u.tolist())]
    out: list[list[int]] = []
    # one draw per sampled request, in request order: (request, output slot, row of probs,
    # draft whose q to take away, or -1 for a bonus draw)
    draws: list[tuple[int, int, int, int]] = []
    start = 0
    for i, n in enumerate(num_drafts):
        if not n and drawn and i in drawn:
            row = [drawn[i]]
        elif greedy[i]:
            row = greedy_verify(drafted[start:start + n], [n],
                                [argmax[r] for r in target_rows[start:start + n]],
                                [argmax[bonus_rows[i]]], n + 1)[0]
        else:
            j = next((k for k in range(n) if not accepted[start + k]), n)
            row = drafted[start:start + j]
            if j < n:  # line 7: first rejection at j, draw from norm((p_j - q_j)+)
                draws.append((i, j, target_rows[start + j], start + j))
            else:  # line 6: all accepted, draw the bonus from p_{n+1}
                draws.append((i, n, bonus_rows[i], -1))
            row = row + [PLACEHOLDER]  # the drawn token's slot
        out.append(row + [PLACEHOLDER] * (width - len(row)))
        start += n
    tokens = _draw(probs, draws, drafted, draft_probs, generators or {})
    for (i, slot, _, _), token in zip(draws, tokens):
        out[i][slot] = token
    return out


def _uniform(num_drafts: list[int], generators: dict[int, torch.Generator]) -> torch.Tensor:
    """[sum(n)] float64 U[0, 1): a seeded request's n from its own generator (none drawn
    for n = 0, as vLLM's ``generate_uniform_probs``), the rest from the global one."""
    u = torch.rand(sum(num_drafts), dtype=torch.float64)
    start = 0
    for i, n in enumerate(num_drafts):
        if n and i in generators:
            u[start:start + n] = torch.rand(n, dtype=torch.float64, generator=generators[i])
        start += n
    return u


def _draw(probs: torch.Tensor, draws: list[tuple[int, int, int, int]], drafted: list[int],
          draft_probs: torch.Tensor | None,
          generators: dict[int, torch.Generator]) -> list[int]:
    """One token per draw: from norm((p - q)+) at a rejected draft's row, from p at a bonus
    row; a seeded request's draw from its generator."""
    if not draws:
        return []
    weights = probs[torch.tensor([d[2] for d in draws])]  # [draws, V], a copy
    for k, (_, _, _, j) in enumerate(draws):
        if j < 0 or drafted[j] < 0:
            continue  # a bonus draw, or a padded draft (q = 0: the residual is p)
        if draft_probs is None:  # point mass at d: (p - q)+ is p with d's mass removed
            weights[k, drafted[j]] = 0.0
        else:
            weights[k] = (weights[k] - draft_probs[j]).clamp_(min=0.0)
    return inverse_cdf(weights, [generators.get(d[0]) for d in draws]).tolist()


def inverse_cdf(weights: torch.Tensor,
                generators: list[torch.Generator | None] | None = None) -> torch.Tensor:
    """One draw per row of ``weights`` [R, V] (>= 0, unnormalised) from norm(row): the first
    token whose cumulative weight exceeds u * total, u ~ U[0, 1) (float64 sums; row r's u
    from ``generators[r]`` where given). A draw over a zero-weight token is impossible (its
    cumulative weight equals its predecessor's). On CPU this is ~10x cheaper than the
    exponential race (``exponential_`` over [R, V])."""
    cumulative = weights.to(torch.float64).cumsum(dim=-1)  # [R, V]
    u = torch.rand(weights.shape[0], 1, dtype=torch.float64)
    for r, generator in enumerate(generators or ()):
        if generator is not None:
            u[r] = torch.rand(1, dtype=torch.float64, generator=generator)
    point = u * cumulative[:, -1:]
    return torch.searchsorted(cumulative, point, right=True).clamp_(max=weights.shape[1] - 1) \
        .squeeze(1)
