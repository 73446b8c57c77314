"""SpecDiff drafting: a masked-diffusion model proposes gamma tokens in T denoising steps.

Speculative Diffusion Decoding (Christopher et al.), Sec. 4.1 / Algorithm 1: the drafter
sees the last W committed tokens followed by gamma mask tokens and, in T << gamma denoising
forwards, reveals the whole window; the autoregressive target then verifies the gamma drafts
in one forward (vLLM's rejection sampler, outside this module).

Why the drafts are verified as point masses: a diffusion drafter reveals positions out of
left-to-right order, and the distribution it gives position i depends on drafts to its right,
so its per-position marginals are *not* the conditionals q(d_i | prefix, d_<i) that the
p/q acceptance proof needs. Treating each draft as a point mass (q = one-hot) is exact for
any drafts drawn independently of the verifier's randomness: position i keeps d_i with
probability p(d_i | prefix) and otherwise resamples from p with d_i removed, which gives
exactly p. Argmax drafts also maximise that acceptance probability when q ~ p.

One drafter forward per denoising step covers the whole batch: rows are right-padded,
positions are sequence indices, padding is excluded as attention keys.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

# denoise(tokens [B, L] long, t [B] float, key_mask [B, L] bool) -> scores [B, L, V] fp32 whose
# softmax over the real tokens is the drafter's distribution at masked positions.
Denoiser = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class SpecDiffSettings:
    num_draft_tokens: int  # gamma: masked positions appended after the context
    steps: int  # T: denoising forwards per draft, 1 <= T <= gamma
    context_window: int  # W: committed tokens the drafter sees (the last W)
    schedule: str = "confidence"  # which masked positions each step reveals
    temperature: float = 0.0  # 0: reveal the drafter's argmax; > 0: sample

    def for_depth(self, depth: int) -> "SpecDiffSettings":
        """The drafting work for a chain of ``depth`` <= gamma drafts (the speculation
        budget's cap): ``depth`` masks revealed at the configured pace (gamma / T positions
        per forward), i.e. ceil(T * depth / gamma) forwards over [B, W + depth] instead of
        T over [B, W + gamma]. Drafts are guesses, verified exactly: any depth is lossless,
        and at depth gamma this is the configured drafting unchanged."""
        depth = max(1, min(depth, self.num_draft_tokens))
        steps = min(depth, -(-self.steps * depth // self.num_draft_tokens))
        return replace(self, num_draft_tokens=depth, steps=steps)


def reveal_counts(gamma: int, steps: int) -> list[int]:
    """Positions revealed at each of the T steps: as even as possible, summing to gamma
    (earlier steps take the remainder, so the final step never reveals more than any other)."""
    base, extra = divmod(gamma, steps)
    return [base + (1 if s < extra else 0) for s in range(steps)]


# ------------------------------------------------------------------ unmasking schedules
# priority(confidence [B, G], still_masked [B, G] bool, generator) -> [B, G]; the step reveals
# the still-masked positions of highest priority.
def _by_confidence(confidence, still_masked, generator):
    return confidence


def _left_to_right(confidence, still_masked, generator):
    gamma = confidence.shape[1]
    return -torch.arange(gamma, dtype=torch.float32).expand_as(confidence)


def _random_order(confidence, still_masked, generator):
    return torch.rand(confidence.shape, generator=generator)


SCHEDULES = {
    "confidence": _by_confidence,  # MDLM/LLaDA-style low-confidence remasking
    "left_to_right": _left_to_right,
    "random": _random_order,  # the absorbing process's own uniformly random order
}


def _window_canvas(contexts: list[list[int]], gamma: int, mask_id: int):
    """Right-padded canvas [B, L] = context + gamma masks, the real-token mask, and the
    index of each row's first draft position."""
    lengths = [len(c) for c in contexts]
    width = max(lengths) + gamma
    canvas = torch.full((len(contexts), width), mask_id, dtype=torch.long)
    key_mask = torch.zeros((len(contexts), width), dtype=torch.bool)
    for row, ctx in enumerate(contexts):
        canvas[row, : len(ctx)] = torch.tensor(ctx, dtype=torch.long)
        key_mask[row, : len(ctx) + gamma] = True
    return canvas, key_mask, torch.tensor(lengths)


def draft(
    denoise: Denoiser,
    contexts: list[list[int]],
    settings: SpecDiffSettings,
    mask_id: int,
    generator: torch.Generator | None = None,
) -> tuple[list[list[int]], int]:
    """Draft ``gamma`` tokens after each context in ``T`` batched denoising forwards.

    contexts: B lists of committed token ids (already cut to the window, non-empty)
    returns:  (B lists of gamma drafted ids, number of drafter forwards run)
    """
    gamma, steps = settings.num_draft_tokens, settings.steps
    if not contexts:
        return [], 0
    canvas, key_mask, starts = _window_canvas(contexts, gamma, mask_id)
    batch = len(contexts)
    cols = starts[:, None] + torch.arange(gamma)[None, :]  # [B, G] canvas column of draft g
    rows = torch.arange(batch)[:, None].expand(-1, gamma)
    still_masked = torch.ones((batch, gamma), dtype=torch.bool)
    priority_of = SCHEDULES[settings.schedule]
    for count in reveal_counts(gamma, steps):
        t = still_masked.float().mean(dim=1)  # [B] masked fraction of the window: 1 -> 0
        scores = denoise(canvas, t, key_mask)[rows, cols].float()  # [B, G, V]
        tokens, confidence = _choose_tokens(scores, settings.temperature, generator)
        priority = priority_of(confidence, still_masked, generator)
        priority = priority.masked_fill(~still_masked, float("-inf"))
        reveal = priority.topk(count, dim=1).indices  # [B, count] window offsets
        picked = torch.zeros_like(still_masked).scatter_(1, reveal, True) & still_masked
        canvas[rows[picked], cols[picked]] = tokens[picked]
        still_masked &= ~picked
    drafts = canvas[rows, cols]  # [B, G]
    return drafts.tolist(), steps


def _choose_tokens(scores: torch.Tensor, temperature: float, generator):
    """Token per window position and the drafter's probability of it.

    scores [B, G, V] -> (tokens [B, G] long, confidence [B, G] float)"""
    probs = torch.softmax(scores, dim=-1)
    if temperature <= 0.0:
        confidence, tokens = probs.max(dim=-1)
        return tokens, confidence
    tempered = torch.softmax(scores / temperature, dim=-1)
    flat = tempered.reshape(-1, tempered.shape[-1])
    tokens = torch.multinomial(flat, 1, generator=generator).view(tempered.shape[:-1])
    return tokens, probs.gather(-1, tokens[..., None]).squeeze(-1)
