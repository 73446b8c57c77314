"""Row arithmetic of the speculation budget's allocation (``core/budget.py``): the candidate
draft-row counts it evaluates, and for the best-first rows of a batch, the expected accepted
drafts and the deepest chain of each prefix."""

from __future__ import annotations


def prefix_sums(values: list[float]) -> list[float]:
    """[0, v0, v0 + v1, ...]: of the gains, the expected accepted drafts of the first r rows."""
    out = [0.0]
    for v in values:
        out.append(out[-1] + v)
    return out


def deepest(order: list[tuple[float, int]], batch: int) -> list[int]:
    """The deepest chain when the first r rows of ``order`` are drafted, for r = 0..len."""
    per, out = [0] * batch, [0]
    for _, row in order:
        per[row] += 1
        out.append(max(out[-1], per[row]))
    return out


def candidates(total: int) -> list[int]:
    """Row counts worth evaluating: every count up to 16, then steps of ~1/8 of the value,
    and the total (cost is piecewise linear in rows, gains concave: the optimum is near)."""
    out, r = [], 1
    while r < total:
        out.append(r)
        r += 1 if r < 16 else max(1, r // 8)
    if total:
        out.append(total)
    return out
