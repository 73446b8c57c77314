"""Drafting prices per batch size: what a drafting step of B requests and r rows costs, from
B's own drafting steps where it has some (``core/budget.py``; the searches and the closed-batch
drain read them through ``budget_search.RowSearch`` and ``budget_drain.DrainValue``).

The cost model (``budget_models.StepCost``) prices a step by its rows alone, and rows mix
requests and drafts. A request costs more than a draft row (issue 22, ``assd``, 2-core AMD VM,
bf16: plain steps 3.7 ms at 8 requests, 5.4-5.9 at 16; a draft row 0.06-0.14 ms at a fixed
batch size), so one pooled curve priced each batch size with the other's steps:

* at batch 8, 24 rows (two drafts each) were priced 7.0 ms from batch 16's steps of 24 rows
  (16 requests, 8 drafts) and 16 rows (one each) 5.3 ms, a low quantile; batch 8's own steps
  took 6.7 and 6.6 ms. One draft each looked far cheaper than two and was chosen for dozens
  of steps at 1.8 tokens per ms, where two each gave 2.6;
* at batch 16, one draft row was priced from batch 8's steps below a plain step of 16
  requests: closed batches drafted 1-12 rows of 16 at 1.5-2.6 tokens per ms against 2.4-3.0
  plain and 3.2-3.5 for a row each.

So each (batch size, drafter stage) keeps its own drafting points (buckets as the cost model
keeps them: ``budget_buckets.Bucket``, a low quantile of seconds by rows), and where
it has a mature one a drafting step there is priced from them: between its points, the line;
below its fewest rows, that point less a draft row's cost at a fixed batch size (its own
secant) -- not a line down to the plain step, which hid the fixed cost of drafting at all;
past its most rows, the pooled curve's rise from there. With one point, below it, the pooled
(drafting) curve's fall to there, as far as the drafting arm's fewest rows, then a drafting
row's cost (``RowSearch._falls``: not the fall to the plain steps that anchor the curve, which
is the price of drafting at all; where there is no pooled curve, the least secant of any
batch size with two; else flat). Not the least secant first: a closed batch's tail meets each batch size
with the deep chains it held, and against one point of 26 rows at batch 4 every fewer row
count was priced all but as dear (flat, where no batch size had two points): the simulated
Jacobi engine of ``test_budget_refined`` ran 784 of 800 steps plain at 0.87 of the best
fixed chain (issue 22). Elsewhere the pooled curve prices it, as before.
"""

from __future__ import annotations

from typing import Callable

from .budget_curves import Curve, interpolate, monotone
from .budget_buckets import YOUNG_SAMPLES, Bucket, observe_bucket


class BatchPrices:
    """Per (batch size, stage), that batch size's drafting steps by rows (low quantiles)."""

    def __init__(self, down: float = 0.5, up: float = 0.05) -> None:
        self.down, self.up = down, up
        self.points: dict[tuple[int, int], dict[int, Bucket]] = {}  # (batch, stage) -> buckets
        self._lines: dict[tuple[int, int], tuple[Curve, float]] = {}  # -> (points, secant)

    def observe(self, batch: int, rows: int, seconds: float, stage: int = 1) -> None:
        """One drafting step of ``batch`` requests and ``rows`` rows that took ``seconds``."""
        key = (batch, stage)
        self._lines.pop(key, None)
        observe_bucket(self.points.setdefault(key, {}), rows, seconds, 0, self.down, self.up)

    def price(self, batch: int, rows: int, stage: int,
              pooled: Callable[[int], float | None],
              falls: Callable[[int], float | None] | None = None) -> float | None:
        """Seconds of a drafting step of ``batch`` requests and ``rows`` rows from this batch
        size's own points; None where it has no mature one (``pooled(rows)``: the pooled
        curve, for rows past its points; ``falls``: the curve whose fall prices rows below
        a lone point, ``pooled`` where not given)."""
        pts, slope = self._line((batch, stage))
        if not pts:
            return None
        (x0, y0), (x1, y1) = pts[0], pts[-1]
        if rows <= x0:
            if len(pts) == 1:  # no secant of its own: the pooled curve's fall to here
                falls = falls or pooled
                here, there = falls(rows), falls(int(round(x0)))
                if here is not None and there is not None:
                    return max(0.0, y0 - max(0.0, there - here))
                slope = self._least_slope()
            return max(0.0, y0 - slope * (x0 - rows))
        if rows >= x1:
            here, there = pooled(rows), pooled(int(round(x1)))
            rise = here - there if here is not None and there is not None else 0.0
            return y1 + max(0.0, rise)
        return interpolate(pts, rows)  # between its points: the line

    def _line(self, key: tuple[int, int]) -> tuple[Curve, float]:
        """The mature points, made non-decreasing (``budget_curves.monotone``), and their
        secant slope (0 with one point); built once until a step changes them."""
        line = self._lines.get(key)
        if line is not None:
            return line
        pts = monotone(sorted((b.rows, b.seconds) for b in self.points.get(key, {}).values()
                              if b.samples >= YOUNG_SAMPLES))
        slope = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]) if len(pts) > 1 else 0.0
        line = self._lines[key] = (pts, slope)
        return line

    def _least_slope(self) -> float:
        """The least per-row secant of the batch sizes with two points or more (0: none)."""
        lines = [self._line(key) for key in self.points]
        return max(0.0, min((s for pts, s in lines if len(pts) > 1), default=0.0))

    def state(self) -> list:
        return sorted((list(k), sorted((n, round(b.rows, 6), round(b.seconds, 9), b.samples)
                                       for n, b in t.items()))
                      for k, t in self.points.items())
