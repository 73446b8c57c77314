"""Piecewise-linear cost curves: the one line arithmetic every step price uses.

A curve is a list of ``(rows, seconds)`` points, sorted by rows, with seconds non-decreasing
(:func:`monotone`). The cost model (``budget_models.StepCost``) and the per-batch-size drafting
prices (``budget_batch_prices.BatchPrices``) both price a row count from such points; the
controller compares their prices against each other, so they must come from the same floats:
:func:`interpolate` is the rule, :func:`price_table` the same rule at every count 0..upto in one
walk (the closed-batch drain reads dozens of counts a decision), held equal to it to the last
bit by ``tests/unit/core/test_budget_step_cost.py``. Pure Python; no torch, no vLLM.
"""

from __future__ import annotations

import bisect
import math

Curve = list[tuple[float, float]]  # (rows, seconds), sorted by rows


def monotone(pts: Curve) -> Curve:
    """More rows never cost less: each point's seconds become the least seconds measured at
    its row count or above. (Noise only ever slows a step, so a point above a larger row
    count's cost is the one that is wrong; a running maximum would spread it upwards.)"""
    out, low = [], float("inf")
    for x, y in reversed(pts):
        low = min(low, y)
        out.append((x, low))
    return out[::-1]


def interpolate(pts: Curve, x: float) -> float:
    """Piecewise-linear through ``pts``; flat below the first point, the last segment's slope
    beyond the last (flat with a single point)."""
    if x <= pts[0][0] or len(pts) == 1:
        return pts[0][1] if x <= pts[0][0] else pts[-1][1]
    i = min(bisect.bisect_left(pts, (x, float("-inf"))), len(pts) - 1)  # first x_i >= x
    (x0, y0), (x1, y1) = pts[i - 1], pts[i]
    return y0 + (y1 - y0) * (x - x0) / max(x1 - x0, 1e-9)  # beyond the last: its slope


def price_table(pts: Curve, upto: int) -> list[float]:
    """:func:`interpolate` at x = 0..upto, segment by segment (the same arithmetic, so the
    same floats): flat up to the first point, then each segment's line over the counts in
    (x0, x1], the last segment's beyond."""
    first = math.floor(pts[0][0]) if pts[0][0] < upto else upto
    out = [pts[0][1]] * (max(first, -1) + 1)  # x <= the first point
    last, x = len(pts) - 1, len(out)
    if last == 0:
        return out + [pts[0][1]] * (upto + 1 - x)
    for i in range(1, last + 1):
        if x > upto:
            break
        (x0, y0), (x1, y1) = pts[i - 1], pts[i]
        hi = upto if i == last or x1 >= upto else math.floor(x1)
        if hi < x:
            continue
        dy, span = y1 - y0, max(x1 - x0, 1e-9)  # interpolate's arithmetic, term for term
        out += [y0 + dy * (v - x0) / span for v in range(x, hi + 1)]
        x = hi + 1
    return out


def secant(pts: Curve, span: float) -> float | None:
    """Slope from the point at or below half the last row count (else the first) to the last
    one, where they are at least ``span`` rows apart."""
    if len(pts) < 2:
        return None
    x1, y1 = pts[-1]
    below = [p for p in pts[:-1] if p[0] <= x1 / 2]
    x0, y0 = below[-1] if below else pts[0]
    return (y1 - y0) / (x1 - x0) if x1 - x0 >= span else None
