"""The speculation budget's predicted gains checked against what the drafted rows really
accepted, position by position (``core/budget.py``; the gains: ``budget_accept.Acceptance``).

The acceptance model prices row j of a request's chain at g_j, the expected accepted drafts
it adds (P(at least j drafts accepted)). A verified chain of k drafts with a accepted shows
exactly that event for rows 1..k: row j was accepted iff j <= a. So the controller compares
its prediction with the outcome for every row it drafted: :class:`Calibration` keeps, per
position bucket and exponentially forgotten, the gains it predicted for those rows and how
many of them were accepted, and scales later gains at that position by the ratio (shrunk to 1
with a pseudo-row of weight ``prior``). The evidence is what the acceptance model itself
counts (``record_verified``): for ``jacobi`` its refined positions only
(``core/jacobi_refined``), so a deep position drafted cold, after a short chain, does not
teach the calibration that deep rows fail (the trap that counting refined positions avoids).
Position 1 has no such trap (every drafting step drafts it), so there every chain's first
draft counts (``record_head``): counted or not, it was priced. Only the counted ones taught
position 1 before, and ``jacobi`` at T=0.8 (concurrency 8, ``ar-target-large``, the AMX Xeon)
priced the first draft at 0.28 where 0.22 were accepted: 0.22 / 0.17 after plain steps and
0.24 / 0.17 after a rejection, its heads cold or stale where the counted ones were pooled
n-grams; the drafting steps lost 1.1% of the time (issue 22).

Why (issue 22, ``jacobi`` at batch 8 on the AMX Xeon, traces holding the predicted gains):
the model builds g_j from conditional rates, and a position seldom judged leans on the one
before it, the rate of a streak. Past position 16 its predictions for the rows it drafted
were 5-10x too high (0.05-0.06 predicted, 0.006-0.027 accepted), at positions 1-3 5-15% low.
In a closed batch's tail (1-3 requests left) it drafted chains of 17-32 that accepted 1.5
tokens where ``cycle:4``'s chains of 4 accepted 1.3: 1.6 tokens per ms against 1.9 (with the
calibration 1.9 against 2.0). Replayed on those traces, the scaled predictions match the
outcomes within ~0.01 at every position (log-loss 3-5% lower).

The scaled gains stay non-increasing in j (a row never adds more than the one before it: the
row ranking merges each request's rows in chain order) and at most 1. Engine-free.
"""

from __future__ import annotations

import math


def position_bucket(j: int) -> int:
    """Exact for the first eight positions (0-based j), then two buckets per doubling."""
    if j < 8:
        return j
    return 8 + int(2 * math.log2((j + 1) / 8.0))


# position_bucket of the positions a chain usually reaches, looked up (every row of every
# request, each decision and each verified chain: ~2 us of log2 a request, issue 22)
_BUCKETS = [position_bucket(j) for j in range(256)]


def _bucket(j: int) -> int:
    return _BUCKETS[j] if j < 256 else position_bucket(j)


class Calibration:
    """Per position bucket, (accepted rows, predicted gains) of the drafted rows, forgotten
    by ``decay`` per row observed there; ``scales()`` their ratios, shrunk to 1."""

    def __init__(self, decay: float = 0.005, prior: float = 1.0) -> None:
        self.decay, self.prior = decay, prior
        self.sums: list[list[float]] = []  # bucket -> [accepted, predicted]
        self._scales: list[float] | None = None
        self._by_position: list[float] | None = None  # the scales by position (apply)
        # req_id -> the gains its last decision priced its rows at (before scaling)
        self.predicted: dict[str, list[float]] = {}

    def priced(self, req_ids: list[str], gains: list[list[float]],
               floor: float = 0.0) -> list[list[float]]:
        """A decision's gains per request (chain order), kept to be checked against the
        outcomes, returned scaled (:meth:`apply`)."""
        self.predicted.update(zip(req_ids, gains))
        return [self.apply(own, floor) for own in gains]

    def verified(self, req_id: str, drafted: int, accepted: int) -> None:
        """A chain's outcome, checked against the gains its request was last priced at."""
        predicted = self.predicted.get(req_id)
        if predicted:
            self.observe(predicted[:drafted], accepted)

    def forget(self, live: set[str]) -> None:
        for req_id in [r for r in self.predicted if r not in live]:
            del self.predicted[req_id]

    def observe(self, predicted: list[float], accepted: int) -> None:
        """One verified chain: ``predicted`` the gains of its drafted rows (in chain order),
        the first ``accepted`` of them accepted."""
        keep, sums = 1.0 - self.decay, self.sums
        for j, g in enumerate(predicted):
            b = _bucket(j)
            while len(sums) <= b:
                sums.append([0.0, 0.0])
            s = sums[b]
            s[0] = s[0] * keep + (1.0 if j < accepted else 0.0)
            s[1] = s[1] * keep + g
        self._scales = self._by_position = None

    def scales(self) -> list[float]:
        """Per bucket, accepted over predicted, shrunk to 1 (built once per observation)."""
        if self._scales is None:
            w = self.prior
            self._scales = [(hits + w) / (predicted + w) for hits, predicted in self.sums]
        return self._scales

    def apply(self, gains: list[float], floor: float = 0.0) -> list[float]:
        """``gains`` scaled by position, capped at 1 and kept non-increasing, stopping before
        the first below ``floor``."""
        by_position = self._by_position
        if by_position is None or len(by_position) < len(gains):
            by_position = self._positions(len(gains))
        out, last = [], 1.0
        for g, scale in zip(gains, by_position):
            scaled = g * scale
            if scaled < last:
                last = scaled
            if last < floor:
                break
            out.append(last)
        return out

    def _positions(self, n: int) -> list[float]:
        """:meth:`scales` by position 0..n-1 (1.0 past the buckets observed: g * 1.0 is g),
        kept until an observation changes them."""
        scales = self.scales()
        count = len(scales)
        self._by_position = [scales[b] if b < count else 1.0
                             for b in (_bucket(j) for j in range(max(n, 32)))]
        return self._by_position

    def state(self) -> list:
        return [[round(h, 9), round(p, 9)] for h, p in self.sums]
