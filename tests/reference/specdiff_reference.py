"""Slow SpecDiff drafting reference: one request at a time, no padding, explicit loops.

Same rule as ``vllm_anyorder.core.specdiff.draft`` (Sec. 4.1: the last W tokens + gamma
masks, T denoising steps, each revealing its share of the still-masked positions chosen by
the schedule), written without batching so the batched version can be checked against it.
"""

from __future__ import annotations

import torch


def reference_draft(denoise, context, gamma, steps, schedule, mask_id, temperature=0.0,
                    random_priorities=None):
    """denoise(tokens [1, L], t [1], key_mask [1, L]) -> scores [1, L, V].

    ``random_priorities(step) -> list[float]`` (len gamma) supplies the "random" schedule's
    priorities; confidence ties break towards the lower offset, as torch.topk does on CPU
    for distinct values (tests use tie-free scores)."""
    assert temperature == 0.0, "the reference drafts argmax tokens"
    canvas = list(context) + [mask_id] * gamma
    masked = [True] * gamma
    base, extra = divmod(gamma, steps)
    for step in range(steps):
        count = base + (1 if step < extra else 0)
        t = torch.tensor([sum(masked) / gamma])
        tokens = torch.tensor([canvas])
        scores = denoise(tokens, t, torch.ones_like(tokens, dtype=torch.bool))[0]
        choice, confidence = [], []
        for g in range(gamma):
            probs = torch.softmax(scores[len(context) + g].float(), dim=-1)
            choice.append(int(probs.argmax()))
            confidence.append(float(probs.max()))
        if schedule == "confidence":
            priority = confidence
        elif schedule == "left_to_right":
            priority = [-g for g in range(gamma)]
        else:
            priority = random_priorities(step)
        order = sorted((g for g in range(gamma) if masked[g]), key=lambda g: -priority[g])
        for g in order[:count]:
            canvas[len(context) + g] = choice[g]
            masked[g] = False
    return canvas[len(context):]
