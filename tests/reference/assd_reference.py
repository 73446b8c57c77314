"""Slow, obviously-correct any-order decoding over the AS-ARM interface (no drafts, no cache).

Sequential decoding (Sec. 3, "Sequential Sampling via Factorization"): for each position of
the generation order sigma, one forward with a single query that sees the visible tokens and
every token generated so far; sample (or take the argmax of) its distribution; repeat.
``exact_joint`` enumerates the joint that sequential sampling draws from.
"""

from __future__ import annotations

import torch


def conditional(model, tokens, positions, sigma, generated, temperature=1.0):
    """p(x_{sigma[g]} | visible tokens, generated tokens), g = len(generated): one query.
    Returns probabilities [V] float64 (a one-hot argmax at temperature 0)."""
    g = len(generated)
    all_tokens = torch.tensor(list(tokens) + list(generated), dtype=torch.long)
    all_positions = torch.tensor(list(positions) + list(sigma[:g]), dtype=torch.long)
    order = torch.tensor([0] * len(tokens) + list(range(1, g + 1)), dtype=torch.long)
    logits = model.content_and_query(all_tokens, all_positions, order,
                                     torch.tensor([sigma[g]], dtype=torch.long))[0]
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(), logits.numel()).double()
    return torch.softmax(logits.double() / temperature, -1)


def sequential_decode(model, tokens, positions, sigma, temperature=1.0, generator=None):
    """Returns (tokens decoded along sigma, model calls = len(sigma))."""
    out: list[int] = []
    for _ in sigma:
        p = conditional(model, tokens, positions, sigma, out, temperature)
        tok = int(p.argmax()) if temperature == 0 else int(
            torch.multinomial(p, 1, generator=generator))
        out.append(tok)
    return out, len(sigma)


def sequential_infill(model, sequence, temperature=0.0, generator=None):
    """Fill the ``None`` entries of ``sequence`` left to right; returns the filled list."""
    sigma = [i for i, x in enumerate(sequence) if x is None]
    visible = [i for i, x in enumerate(sequence) if x is not None]
    out, _ = sequential_decode(model, [sequence[i] for i in visible], visible, sigma,
                               temperature, generator)
    filled = list(sequence)
    for pos, tok in zip(sigma, out):
        filled[pos] = tok
    return filled


def exact_joint(model, tokens, positions, sigma, temperature=1.0):
    """{tokens along sigma: probability} of sequential sampling, by enumeration (V^G terms,
    sum_g V^g forwards): only for tiny vocabularies and a few generated tokens."""
    joint = {(): 1.0}
    for _ in sigma:
        nxt = {}
        for prefix, pr in joint.items():
            p = conditional(model, tokens, positions, sigma, list(prefix), temperature)
            for tok in range(p.numel()):
                if p[tok] > 0:
                    nxt[prefix + (tok,)] = pr * float(p[tok])
        joint = nxt
    return joint

