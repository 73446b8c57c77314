"""Row arithmetic of the speculation budget's allocation (``core/budget.py``): the candidate
draft-row counts it evaluates, an open batch's rows ranked best first, and for the best-first
rows of a batch, the expected accepted drafts and the deepest chain of each prefix."""

from __future__ import annotations

import operator

_gain = operator.itemgetter(0)


def prefix_sums(values: list[float]) -> list[float]:
    """[0, v0, v0 + v1, ...]: of the gains, the expected accepted drafts of the first r rows."""
    out = [0.0]
    for v in values:
        out.append(out[-1] + v)
    return out


def deepest(order: list[tuple[float, int]], batch: int) -> list[int]:
    """The deepest chain when the first r rows of ``order`` are drafted, for r = 0..len."""
    per, out, most = [0] * batch, [0], 0
    for _, row in order:
        n = per[row] = per[row] + 1
        if n > most:
            most = n
        out.append(most)
    return out


def ranked_rows(gains: list[list[float]], most: int) -> list[tuple[float, int]]:
    """The ``most`` best candidate draft rows of the batch as (gain, batch row), best gain
    first, from each request's row gains (a request's gains are non-increasing, so its rows
    come in chain order)."""
    order = [(g, row) for row, own in enumerate(gains) for g in own]
    # descending runs, one per request: timsort merges them in about n log(batch)
    order.sort(key=_gain, reverse=True)
    return order[:most]


def caps_of(order: list[tuple[float, int]], rows: int, batch: int) -> list[int]:
    """Drafts per request when the first ``rows`` of ``order`` (gain, batch row) are drafted."""
    caps = [0] * batch
    for _, row in order[:rows]:
        caps[row] += 1
    return caps


def probe_caps(order: list[tuple[float, int]], rows: int, limits: list[int],
               most: int) -> list[int]:
    """An upward probe's caps: the ``rows`` best rows, and at least one draft each where
    that stays within ``most`` rows."""
    caps = caps_of(order, rows, len(limits))
    lifted = [c or min(1, lim) for c, lim in zip(caps, limits)]
    return lifted if sum(lifted) <= most else caps


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


class TrustRegion:
    """How many draft rows a step may verify at each batch size: the rows of the widest
    drafting step measured at this batch size or a larger one, at most doubled (one draft per
    request before any). Rows are explored by doubling, never by a blind jump: the cost model
    extrapolates past its widest measurement, and a step learned at a smaller batch says
    nothing safe about a larger one (under Poisson load, chains learned at batch 8 let batch
    16 verify 272 rows in one step, 6x a plain step there: a latency spike for every request
    in the batch)."""

    def __init__(self) -> None:
        self.widest: dict[int, int] = {}  # batch size -> most rows of a measured drafting step

    def observe(self, batch: int, rows: int) -> None:
        if batch > 0 and rows > self.widest.get(batch, 0):
            self.widest[batch] = rows

    def reach(self, batch: int) -> int:
        """Draft rows (over the batch) that a step at this batch size may verify."""
        trusted = max((r for b, r in self.widest.items() if b >= batch), default=0)
        return max(batch, 2 * trusted - batch)
