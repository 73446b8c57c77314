"""Chi-square goodness of fit for sampled continuations against exact model conditionals."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np


def conditional_chisquare(samples: list[tuple[int, ...]], position: int, cond_probs,
                          min_expected: float = 5.0) -> tuple[float, int, float]:
    """Test token ``position`` of every sample against p(. | prompt, sample[:position]).

    ``cond_probs(prefix) -> np.ndarray[V]`` gives the exact conditional. Per prefix group,
    cells with expected count < ``min_expected`` are merged into one "rest" cell.
    Returns (statistic, degrees of freedom, p-value).
    """
    from scipy.stats import chi2

    groups: dict[tuple[int, ...], Counter] = defaultdict(Counter)
    for s in samples:
        groups[tuple(s[:position])][s[position]] += 1
    stat, df = 0.0, 0
    for prefix, counts in groups.items():
        n = sum(counts.values())
        expected = n * np.asarray(cond_probs(prefix), dtype=np.float64)
        big = expected >= min_expected
        obs = np.array([counts.get(i, 0) for i in range(len(expected))], dtype=np.float64)
        cells_o = list(obs[big]) + [obs[~big].sum()]
        cells_e = list(expected[big]) + [expected[~big].sum()]
        if cells_e[-1] < min_expected:  # fold a tiny rest cell into the smallest big cell
            if len(cells_e) == 1:
                continue
            o, e = cells_o.pop(), cells_e.pop()
            j = int(np.argmin(cells_e))
            cells_o[j] += o
            cells_e[j] += e
        if len(cells_e) < 2:
            continue
        stat += float(sum((o - e) ** 2 / e for o, e in zip(cells_o, cells_e) if e > 0))
        df += len(cells_e) - 1
    return stat, df, float(chi2.sf(stat, df)) if df else 1.0


def truncated_probs(logits, temperature: float, top_k: int = 0, top_p: float = 1.0):
    """vLLM's order: scale by temperature, keep top-k, then the top-p nucleus; renormalise."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    if top_k and top_k < len(z):
        kth = np.sort(z)[-top_k]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(p)  # ascending, like vLLM: drop the low tail summing to <= 1-top_p
        cum = np.cumsum(p[order])
        drop = order[cum <= 1.0 - top_p]
        drop = drop[: len(p) - 1]  # always keep at least one token
        p[drop] = 0.0
        p /= p.sum()
    return p
