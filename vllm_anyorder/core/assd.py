"""Any-Subset Speculative Decoding (ASSD): an AS-ARM drafts and verifies itself.

Guo & Ermon, "Reviving Any-Subset Autoregressive Models with Principled Parallel Sampling
and Speculative Decoding", Sec. 5, Algorithm 1 (self-drafting), App. E.4 Algorithm 2
(context-bigram drafting), App. A (Lemma 1, Theorems 1-2).

The model is anything with the AS-ARM interface (the plain-PyTorch reference is
``AnySubsetLlamaForCausalLM`` in ``model_executor/asarm.py``)::

    model.content_and_query(tokens [L], positions [L], order [L], query_positions [Q])
        -> logits [Q, V]   # row q: p(x_{query_positions[q]} | tokens decoded before it)

``order`` is 0 for visible tokens and 1, 2, ... in generation order; a query at a position that
already holds a (drafted) token sees only the tokens of lower order, elsewhere it sees all.

One round, with n tokens of the generation order sigma decoded and t = min(n + k, N):

1. draft (Alg. 1 lines 5-8): one forward with queries at sigma[n:t], every query seeing the
   decoded set; drafts are sampled *independently* and their distributions q kept.
   (Alg. 2 instead drafts from bigram counts of the decoded sequence, no forward.)
2. the last position alone (lines 9-11): its draft is exact, accept it without verifying.
3. verify (lines 13-15): one forward over decoded + drafts, draft i at rank n+i, so the query
   at sigma[n+i] sees decoded + drafts < i and gives p_i.
4. accept (lines 17-25): keep draft i with probability min(1, p_i(x)/q_i(x)); at the first
   rejection draw the recovered token from (p_i - q_i)+ and end the round.

Lemma 1: the first draft's verifying query conditions on exactly the draft's context, so
p_0 == q_0 and it is always accepted; we use q_0 for p_0 so float rounding cannot reject it.
With it, a round with two forwards commits >= 2 tokens, so forwards <= tokens (Theorem 1).

``reuse_verify`` (on by default, beyond Alg. 1): the verifying forward also carries queries
for the *next* round's positions sigma[t:t+k] (self) or sigma[t] (n-gram), conditioned on
decoded + every draft. When all drafts are accepted that is exactly the next round's draft
distribution, so the next round skips its drafting forward (self), or the bonus token is
sampled from it (n-gram; Alg. 1 has no bonus). After a rejection the rows are discarded.
Theorem 1 still holds: every round commits at least as many tokens as it makes forwards.

Greedy (temperature 0): every distribution is the one-hot argmax, so the same rule accepts a
draft iff it equals the target argmax and recovers the argmax; output == sequential greedy.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch

from .assd_drafters import DRAFTERS, AssdDrafter


class AsArm(Protocol):
    config: object  # has .vocab_size (the bigram drafter sizes its distributions with it)

    def content_and_query(self, tokens: torch.Tensor, positions: torch.Tensor,
                          order: torch.Tensor, query_positions: torch.Tensor
                          ) -> torch.Tensor: ...


@dataclass(frozen=True)
class AssdSettings:
    k: int = 5  # drafts per round (Alg. 1 line 3); the paper advises k > 2
    temperature: float = 1.0  # applied to drafts and targets alike; 0 = greedy
    drafter: str = "self"  # one of DRAFTERS: Alg. 1 (self) or Alg. 2 (context bigram)
    reuse_verify: bool = True  # the verifying forward also drafts the next round

    def __post_init__(self) -> None:
        if self.k < 1 or self.temperature < 0 or self.drafter not in DRAFTERS:
            raise ValueError(f"need k >= 1, temperature >= 0, drafter in {list(DRAFTERS)}: "
                             f"{self}")

    @property
    def kind(self) -> AssdDrafter:
        return DRAFTERS[self.drafter]


@dataclass(frozen=True)
class Round:
    drafted: int  # t - n positions drafted
    accepted: int  # drafts kept by the rule (>= 1 with the self drafter: Lemma 1)
    committed: int  # accepted + recovered/bonus tokens decoded this round
    forwards: int  # model calls this round: 0, 1 or 2
    first_gap: float = 0.0  # max |p_0 - q_0| of the verifying forward (0 exactly: Lemma 1)


@dataclass(frozen=True)
class AssdResult:
    positions: tuple[int, ...]  # [G] sigma: the positions filled, in generation order
    tokens: tuple[int, ...]  # [G] the token decoded at each of them
    model_calls: int  # forwards of the AS-ARM for this request
    rounds: tuple[Round, ...]


def target_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[R, V] logits -> [R, V] float64 probabilities (one-hot argmax at temperature 0)."""
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).double()
    return torch.softmax(logits.double() / temperature, -1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One independent draw per row of probs [R, V] -> [R] long (argmax if one-hot), drawn
    on the generator's device (a seeded request's generator may live on a GPU)."""
    if bool(((probs == 0) | (probs == 1)).all()):  # point masses: no randomness consumed
        return probs.argmax(-1)
    device = generator.device if generator is not None else probs.device
    return torch.multinomial(probs.to(device), 1, generator=generator)[:, 0].to(probs.device)


def sample_drafts(logits: torch.Tensor, temperature: torch.Tensor | None, budgets: list[int],
                  generators: list[torch.Generator | None],
                  transform: Callable[[torch.Tensor], torch.Tensor] | None = None):
    """The drafts of ``assd`` in the engine (Alg. 1 line 7 under the engine's sampling
    transform): each draft independently from q = softmax(transform(logits / T)) of its
    request, the one-hot argmax where T == 0 -- the transform the engine's rejection sampler
    applies to the target, so its rule min(1, p/q) is exact. The exponential race
    argmax(q / E), E ~ Exp(1), is one draw of q; each E is drawn with the request's generator
    (seeded requests reproduce) on that generator's device.

    logits [N, V] (N = sum(budgets), request-major); temperature [N] (None: all greedy);
    generators: one per request (None: the global RNG). Returns drafts [N] long and
    q [N, V] float32, on the logits' device."""
    greedy_q = torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    if temperature is None:
        return logits.argmax(-1), greedy_q
    greedy = temperature == 0  # the engine's greedy temperature
    z = logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    q = torch.softmax(transform(z) if transform is not None else z, dim=-1)
    noise = torch.empty_like(q)
    start = 0
    for n, gen in zip(budgets, generators):
        device = gen.device if gen is not None else q.device
        noise[start: start + n] = torch.empty((n, q.shape[-1]), dtype=q.dtype, device=device
                                              ).exponential_(generator=gen).to(q.device)
        start += n
    drafts = torch.where(greedy, logits.argmax(-1), (q / noise).argmax(-1))
    return drafts, torch.where(greedy[:, None], greedy_q, q)


def verify_drafts(drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                  generator: torch.Generator | None) -> tuple[int, list[int]]:
    """Alg. 1 lines 17-25. drafts [d], q [d, V] draft dists, p [d, V] target dists.

    Returns (accepted count m, committed tokens): the m accepted drafts, then the token
    recovered from (p - q)+ at the first rejection when m < d."""
    d = drafts.numel()
    ratio = p[torch.arange(d), drafts] / q[torch.arange(d), drafts]  # [d]
    if bool(((ratio > 0) & (ratio < 1)).any()):  # line 18: r ~ U[0, 1) per draft
        accept = torch.rand(d, generator=generator, dtype=torch.float64) < ratio.clamp(max=1)
    else:  # point masses (greedy): the rule is deterministic, consume no randomness
        accept = ratio >= 1
    m = d if bool(accept.all()) else int((~accept).long().argmax())  # first rejection
    out = drafts[:m].tolist()
    if m < d:  # line 22: resample from (p - q)+, normalised
        residual = (p[m] - q[m]).clamp(min=0)
        residual = residual / residual.sum() if residual.sum() > 0 else p[m]
        out.append(int(sample(residual[None], generator)[0]))
    return m, out


class BigramDrafter:
    """Alg. 2: c(a | b) from adjacent decoded pairs (x_i, x_{i+1}) of the sequence (Eq. 23).

    Normalised over the pairs that start in b (Eq. 23 divides by every b, so its rows need not
    sum to 1); with no such pair (or no left neighbour) it falls back to the unigram counts of
    the decoded tokens, then to uniform."""

    def __init__(self, vocab_size: int, decoded: dict[int, int]) -> None:
        self.vocab_size, self.decoded = vocab_size, dict(decoded)
        self.pairs: dict[int, Counter] = defaultdict(Counter)
        self.unigram: Counter = Counter(decoded.values())
        for p, tok in decoded.items():
            if p + 1 in decoded:
                self.pairs[tok][decoded[p + 1]] += 1

    def observe(self, position: int, token: int) -> None:
        """A token was decoded: count the bigrams it completes."""
        self.decoded[position] = token
        self.unigram[token] += 1
        if position - 1 in self.decoded:
            self.pairs[self.decoded[position - 1]][token] += 1
        if position + 1 in self.decoded:
            self.pairs[token][self.decoded[position + 1]] += 1

    def _counts(self, cond: int | None) -> Counter:
        counts = self.pairs.get(cond) if cond is not None else None
        return counts or self.unigram

    def dist(self, cond: int | None) -> torch.Tensor:
        counts = self._counts(cond)
        v = torch.ones(self.vocab_size, dtype=torch.float64)
        if counts:
            v = torch.zeros_like(v)
            v[list(counts)] = torch.tensor(list(counts.values()), dtype=torch.float64)
        return v / v.sum()

    def mode(self, cond: int | None) -> int:
        """argmax of ``dist(cond)`` (lowest token id among ties, as ``argmax``), no tensor."""
        counts = self._counts(cond)
        return min(counts, key=lambda t: (-counts[t], t)) if counts else 0

    def draft(self, targets: Sequence[int], greedy: bool, generator, with_q: bool = True):
        """Lines 1-9: x_cond = the token left of the target, decoded or drafted this round.
        Greedy: q is the point mass at the mode (no randomness consumed); ``with_q=False``
        (greedy only) returns None for q, for a verifier that reads none."""
        drafted: dict[int, int] = {}
        tokens, dists = [], []
        for pos in targets:
            cond = self.decoded.get(pos - 1, drafted.get(pos - 1))
            if greedy:
                tok = self.mode(cond)
            else:
                dists.append(self.dist(cond))
                tok = int(sample(dists[-1][None], generator)[0])
            drafted[pos] = tok
            tokens.append(tok)
        tokens = torch.tensor(tokens, dtype=torch.long)
        if greedy:
            return tokens, (torch.nn.functional.one_hot(tokens, self.vocab_size).double()
                            if with_q else None)
        return tokens, torch.stack(dists)  # [d], [d, V]


def assd_decode(model: AsArm, tokens: Sequence[int], positions: Sequence[int],
                sigma: Sequence[int], settings: AssdSettings,
                generator: torch.Generator | None = None) -> AssdResult:
    """Decode the positions ``sigma`` (in that order) given the visible ``tokens`` at
    ``positions``; Algorithm 1 (or 2) with the options above."""
    s, greedy = settings, settings.temperature == 0
    if set(sigma) & set(positions) or len(set(sigma)) != len(sigma):
        raise ValueError("sigma must list distinct positions that hold no visible token")
    vis_tok, vis_pos = torch.tensor(list(tokens), dtype=torch.long), list(positions)
    out: list[int] = []  # tokens decoded so far, aligned with sigma[:n]
    rounds: list[Round] = []
    calls = 0
    bigram = None
    pending = None  # (drafts [k'], q [k', V]) for the next round, from a verifying forward

    def forward(gen_tokens: list[int], queries: Sequence[int]) -> torch.Tensor:
        nonlocal calls
        calls += 1
        g = len(gen_tokens)
        return model.content_and_query(
            torch.cat([vis_tok, torch.tensor(gen_tokens, dtype=torch.long)]),  # [L]
            torch.tensor(vis_pos + list(sigma[:g]), dtype=torch.long),  # [L]
            torch.cat([torch.zeros(len(vis_pos), dtype=torch.long),
                       torch.arange(1, g + 1)]),  # [L] 0 visible, 1.. generation order
            torch.tensor(list(queries), dtype=torch.long))  # [Q]

    while len(out) < len(sigma):
        n = len(out)
        t = min(n + s.k, len(sigma))
        targets = sigma[n:t]
        before = calls
        if pending is not None:  # drafted by the previous round's verifying forward
            drafts, q = pending[0][: t - n], pending[1][: t - n]
        elif s.kind.queries_target:  # lines 5-8: parallel queries, each seeing the decoded set
            q = target_probs(forward(out, targets), s.temperature)  # [d, V]
            drafts = sample(q, generator)  # [d] independent draws
        else:  # Alg. 2
            if bigram is None:
                vocab = getattr(model, "config").vocab_size
                bigram = BigramDrafter(vocab, dict(zip(vis_pos, tokens)))
            drafts, q = bigram.draft(targets, greedy, generator)
        pending = None
        if t - n == 1 and s.kind.queries_target:  # lines 9-11: exact, no verification
            committed, accepted, gap = [int(drafts[0])], 1, 0.0
        else:  # lines 13-15: draft i's query sees decoded + drafts < i
            extra = (s.k if s.kind.queries_target else 1) if s.reuse_verify else 0
            lookahead = sigma[t: t + extra]
            logits = forward(out + drafts.tolist(), list(targets) + list(lookahead))
            p = target_probs(logits[: t - n], s.temperature)  # [d, V]
            gap = 0.0
            if s.kind.queries_target:  # Lemma 1: p_0 == q_0 up to rounding; use q_0 exactly
                gap = float((p[0] - q[0]).abs().max())
                p[0] = q[0]
            accepted, committed = verify_drafts(drafts, q, p, generator)  # lines 17-25
            if accepted == t - n and len(lookahead):  # every draft kept: rows are exact
                la = target_probs(logits[t - n:], s.temperature)  # [len(lookahead), V]
                if s.kind.queries_target:
                    pending = (sample(la, generator), la)
                else:
                    committed.append(int(sample(la[:1], generator)[0]))  # bonus token
        if bigram is not None:  # Alg. 2's counts grow with the decoded sequence
            for pos, tok in zip(sigma[n: n + len(committed)], committed):
                bigram.observe(pos, tok)
        out += committed
        rounds.append(Round(t - n, accepted, len(committed), calls - before, gap))
    return AssdResult(tuple(sigma), tuple(out), calls, tuple(rounds))


@dataclass(frozen=True)
class InfillResult:
    sequence: tuple[int, ...]  # [N] the input with every masked position filled
    decode: AssdResult


def infill(model: AsArm, sequence: Sequence[int | None], settings: AssdSettings,
           generator: torch.Generator | None = None, mask_id: int | None = None
           ) -> InfillResult:
    """Fill every masked entry (``None`` or ``mask_id``; any number of spans) of ``sequence``.
    Visible tokens are untouched; masked positions are decoded left to right (Eq. 4)."""
    masked = [i for i, x in enumerate(sequence) if x is None or x == mask_id]
    visible = [i for i in range(len(sequence)) if i not in set(masked)]
    res = assd_decode(model, [int(sequence[i]) for i in visible], visible, masked, settings,
                      generator)
    filled = list(sequence)
    for pos, tok in zip(res.positions, res.tokens):
        filled[pos] = tok
    return InfillResult(tuple(filled), res)


def generate(model: AsArm, prompt: Sequence[int], max_new: int, settings: AssdSettings,
             generator: torch.Generator | None = None) -> AssdResult:
    """Left-to-right continuation: sigma = len(prompt), len(prompt) + 1, ..."""
    return assd_decode(model, prompt, range(len(prompt)),
                       list(range(len(prompt), len(prompt) + max_new)), settings, generator)
