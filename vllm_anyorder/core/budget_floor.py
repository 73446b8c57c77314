"""What drafting steps cost at each batch size itself: a floor under the price of a drafting
step there (``core/budget_drain``'s closed-batch valuation).

The cost model (``budget_models.StepCost``) prices a step by its rows alone, and rows mix
requests and drafts: at a batch of 8 with a draft each, 16 rows drafting took 5.3 ms, while 16
requests decoding plain took 5.4-5.9 ms (issue 22, ``assd``, 2-core AMD VM, bf16: a request
costs more than a draft row, 0.28 against 0.06-0.14 ms). Priced from the batch-8 buckets, one
draft row at batch 16 looked cheaper than none, and closed batches of 16 drafted 1-12 rows
at 1.5-2.6 tokens per ms against 2.4-3.0 plain and 3.2-3.5 for a row each.

So each batch size keeps its own drafting points (rows, a low quantile of seconds: falls fast
to a faster step, rises slowly, as the cost model's buckets do), and a drafting step of B
requests and r rows is priced at least the line through B's own points at r: below its
fewest rows measured, that point less a draft row's cost at a fixed batch size (B's own
secant; with one point, the least secant of any batch size with two, else none: flat). The
fixed cost of drafting at all is what a line down to the plain step at B hid. A batch size
never measured drafting has no floor.
"""

from __future__ import annotations

import bisect

YOUNG = 3  # samples before a point counts


class DraftingFloor:
    """Per batch size, its drafting steps' seconds by rows (low quantiles)."""

    def __init__(self, down: float = 0.5, up: float = 0.05) -> None:
        self.down, self.up = down, up
        self.points: dict[int, dict[int, list[float]]] = {}  # batch -> rows -> [s, samples]
        self._lines: dict[int, tuple[list[int], list[float], float]] = {}

    def observe(self, batch: int, rows: int, seconds: float) -> None:
        """One drafting step of ``batch`` requests and ``rows`` rows that took ``seconds``."""
        p = self.points.setdefault(batch, {}).get(rows)
        self._lines.pop(batch, None)
        if p is None:
            self.points[batch][rows] = [seconds, 1]
            return
        if p[1] < YOUNG:  # a young point takes its fastest sample outright
            p[0] = min(p[0], seconds)
        else:
            p[0] += (self.down if seconds < p[0] else self.up) * (seconds - p[0])
        p[1] += 1

    def __call__(self, batch: int, rows: int) -> float:
        """Seconds no drafting step of ``batch`` requests and ``rows`` rows is priced below
        (0: nothing measured there)."""
        line = self._lines.get(batch)
        if line is None:
            line = self._lines[batch] = self._line(batch)
        xs, ys, slope = line
        if not xs:
            return 0.0
        if rows <= xs[0]:
            if len(xs) == 1:
                slope = self._least_slope()
            return max(0.0, ys[0] - slope * (xs[0] - rows))
        if rows >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_left(xs, rows)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (rows - x0) / (x1 - x0)

    def _least_slope(self) -> float:
        """The least per-row secant of the batch sizes with two points or more (0: none)."""
        slopes = []
        for batch in self.points:
            line = self._lines.get(batch)
            if line is None:
                line = self._lines[batch] = self._line(batch)
            if len(line[0]) > 1:
                slopes.append(line[2])
        return max(0.0, min(slopes, default=0.0))

    def _line(self, batch: int) -> tuple[list[int], list[float], float]:
        """The batch's mature points, made non-decreasing (the least at or above each), and
        their secant slope (0 with one point)."""
        pts = sorted((r, p[0]) for r, p in self.points.get(batch, {}).items() if p[1] >= YOUNG)
        xs, ys, low = [], [], float("inf")
        for r, s in reversed(pts):
            low = min(low, s)
            xs.append(r)
            ys.append(low)
        xs.reverse()
        ys.reverse()
        slope = (ys[-1] - ys[0]) / (xs[-1] - xs[0]) if len(xs) > 1 else 0.0
        return xs, ys, slope

    def state(self) -> list:
        return sorted((b, sorted((r, round(p[0], 9), p[1]) for r, p in t.items()))
                      for b, t in self.points.items())
