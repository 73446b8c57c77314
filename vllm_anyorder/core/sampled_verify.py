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
it. A greedy request (temperature 0) takes the argmax rule of ``core/greedy_verify``. Only
the rows the rule reads are normalised (a draft after a rejection is never tested), and
draws are by inverse CDF (:func:`inverse_cdf`; vLLM's kernels race exponentials, the same
distribution). A seeded request (its own ``torch.Generator``, as vLLM keeps one per request
with a ``seed``) takes every uniform it needs from that generator, so its output depends on
its seed and its drafts only, never on the rest of the batch; a seeded request without
drafts can be drawn by the caller (``drawn``: vLLM draws it as on a step without drafts, so
whether the rest of the batch drafted does not change its output). ``patches/cpu_kernels``
runs this for CPU steps in place of vLLM's kernel path (issue 22): same distribution, fewer
passes over the vocabulary.
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


def sampled_verify(drafts: torch.Tensor, num_drafts: list[int], scores: torch.Tensor,
                   greedy: list[bool], argmax: list[int] | None = None,
                   draft_probs: torch.Tensor | None = None,
                   uniform: torch.Tensor | None = None,
                   target_rows: list[int] | None = None,
                   bonus_rows: list[int] | None = None,
                   generators: dict[int, torch.Generator] | None = None,
                   drawn: dict[int, int] | None = None) -> list[list[int]]:
    """Each request's committed tokens, padded with :data:`PLACEHOLDER` to max(n) + 1.

    ``drafts``: [sum(n)] int, request-major; ``scores``: [sum(n + 1), V] float32 log-weights,
    the target's sampling distribution at row r being softmax(scores[r]) (logits after
    temperature and truncation, -inf where excluded; layout of :func:`request_rows`);
    ``greedy``: [batch] requests verified by argmax, whose rows' argmax is ``argmax``
    [sum(n + 1)] (needed only when some request is greedy); ``draft_probs``: [sum(n), V] the
    q each draft came from, or None (point masses); ``uniform``: [sum(n)] float64 U[0, 1)
    draws (drawn here if None); ``target_rows`` / ``bonus_rows``: where each draft's and each
    request's bonus row sit in ``scores`` (default: the layout of :func:`request_rows`);
    ``generators``: request index -> its generator, for seeded requests (vLLM's
    ``SamplingMetadata.generators``); ``drawn``: request -> its token, for sampled requests
    without drafts whose token the caller drew.

    Only the rows the rule reads are normalised: a draft is tested once every draft before it
    was accepted, and one row a request is drawn from."""
    width = max(num_drafts, default=0) + 1
    if target_rows is None or bonus_rows is None:
        target_rows, bonus_rows = request_rows(num_drafts)
    drafted: list[int] = drafts.tolist()
    starts = [0] * len(num_drafts)
    for i in range(1, len(num_drafts)):
        starts[i] = starts[i - 1] + num_drafts[i - 1]
    sampled = [i for i, n in enumerate(num_drafts) if n and not greedy[i]]
    lengths: dict[int, int] = {}  # sampled request -> its accepted prefix length
    if sampled:
        q = [1.0] * len(drafted) if draft_probs is None else draft_probs.reshape(-1)[
            torch.tensor([j * draft_probs.shape[1] + max(d, 0)
                          for j, d in enumerate(drafted)])].tolist()
        u = (_uniform(num_drafts, generators or {}) if uniform is None else uniform).tolist()
        lengths = _accepted_lengths(scores, drafted, [(i, starts[i], num_drafts[i])
                                                      for i in sampled], target_rows, q, u)
    out: list[list[int]] = []
    # one draw per sampled request, in request order: (request, output slot, row of scores,
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
            j = lengths.get(i, 0)
            row = drafted[start:start + j]
            if j < n:  # line 7: first rejection at j, draw from norm((p_j - q_j)+)
                draws.append((i, j, target_rows[start + j], start + j))
            else:  # line 6: all accepted, draw the bonus from p_{n+1}
                draws.append((i, n, bonus_rows[i], -1))
            row = row + [PLACEHOLDER]  # the drawn token's slot
        out.append(row + [PLACEHOLDER] * (width - len(row)))
        start += n
    tokens = _draw(scores, draws, drafted, draft_probs, generators or {})
    for (i, slot, _, _), token in zip(draws, tokens):
        out[i][slot] = token
    return out


def _accepted_lengths(scores: torch.Tensor, drafted: list[int],
                      requests: list[tuple[int, int, int]], target_rows: list[int],
                      q: list[float], u: list[float]) -> dict[int, int]:
    """Line 5 in order: request -> how many of its drafts are accepted before the first
    rejection. ``requests``: (request, index of its first draft, n). Two passes: every
    request's first draft, then the rest of the drafts of those that accepted it (rows after
    a first rejection are not normalised: at low acceptance that is most of them)."""
    first = _accepts(scores, [s for _, s, _ in requests], drafted, target_rows, q, u)
    lengths = {i: int(ok) for (i, _, _), ok in zip(requests, first)}
    rest = [(i, s, n) for (i, s, n), ok in zip(requests, first) if ok and n > 1]
    if rest:
        tested = iter(_accepts(scores, [s + j for _, s, n in rest for j in range(1, n)],
                               drafted, target_rows, q, u))
        for i, _, n in rest:
            tail = [next(tested) for _ in range(n - 1)]  # drafts 2..n of request i
            lengths[i] += next((j for j, ok in enumerate(tail) if not ok), n - 1)
    return lengths


def _accepts(scores: torch.Tensor, flat: list[int], drafted: list[int], target_rows: list[int],
             q: list[float], u: list[float]) -> list[bool]:
    """Line 5 for the drafts at ``flat``: u * q(d) <= p(d), p the softmax of the draft's
    target row; a padded draft (-1) and a draft q gave no mass are rejected."""
    rows = scores[torch.tensor([target_rows[f] for f in flat])]  # [m, V]
    tokens = torch.tensor([[max(drafted[f], 0)] for f in flat])  # [m, 1]
    p = rows.softmax(dim=-1).gather(1, tokens).view(-1).tolist()
    return [drafted[f] >= 0 and q[f] > 0 and u[f] * q[f] <= pf for f, pf in zip(flat, p)]


def _uniform(num_drafts: list[int], generators: dict[int, torch.Generator]) -> torch.Tensor:
    """[sum(n)] float64 U[0, 1): a seeded request's n from its own generator (none drawn
    for n = 0, as vLLM's ``generate_uniform_probs``), the rest from the global one."""
    return _uniforms(num_drafts, [generators.get(i) for i in range(len(num_drafts))])


def _uniforms(sizes: list[int], generators: list[torch.Generator | None]) -> torch.Tensor:
    """[sum(sizes)] float64 U[0, 1): slot k's sizes[k] from ``generators[k]`` where given
    (nothing drawn from it for size 0), the rest from the global generator."""
    u = torch.rand(sum(sizes), dtype=torch.float64)
    start = 0
    for n, generator in zip(sizes, generators):
        if n and generator is not None:
            u[start:start + n] = torch.rand(n, dtype=torch.float64, generator=generator)
        start += n
    return u


def _draw(scores: torch.Tensor, draws: list[tuple[int, int, int, int]], drafted: list[int],
          draft_probs: torch.Tensor | None,
          generators: dict[int, torch.Generator]) -> list[int]:
    """One token per draw: from norm((p - q)+) at a rejected draft's row, from p at a bonus
    row; a seeded request's draw from its generator."""
    if not draws:
        return []
    weights = scores[torch.tensor([d[2] for d in draws])].softmax(dim=-1)  # [draws, V]
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
    rows = weights.shape[0]
    u = _uniforms([1] * rows, generators or [None] * rows).unsqueeze(1)  # [R, 1]
    point = u * cumulative[:, -1:]
    return torch.searchsorted(cumulative, point, right=True).clamp_(max=weights.shape[1] - 1) \
        .squeeze(1)
