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

Checked apart by what the request's step before did, too (:data:`HISTORIES`): it verified
no chain (plain, or the request is new), a chain it rejected part of, or a chain it accepted
whole. The acceptance model's rates are a request's average, and acceptance runs in streaks:
``jacobi`` greedy at concurrency 8 (``ar-target-large``, the AMX Xeon, one traced server)
priced its rows within 0.01-0.03 of the outcomes overall, yet after a whole chain it priced
rows 1-8 at 0.61-0.27 where 0.72-0.40 were accepted, and rows past 10 at 0.24 where 0.46 were
(2,159 rows); after a rejection, rows past 10 at 0.14 / 0.05 (5,378 rows). So rows went to
chains that had just failed, not to those in a streak. Each history's ratio is shrunk to the
engine-wide one (``history_prior`` pseudo-rows) and learns from the counted rows only: a
first draft the counting rule left out (``record_head``: cold after plain steps, or stale)
checks the engine-wide price alone. Fed those too, a history would learn that cold chains
fail, and the trap above returns in another guise (a chain warms only by being drafted):
``test_budget_refined``'s simulated Jacobi at batch 4 then ran 0.89-0.91 of the best fixed
chain over three seeds, against 0.98-0.99 now and 0.98 without histories. In that file's
simulation of streaks, histories gained 0-3% at batch 1 / 4 / 8 (six seeds each). The
history costs one stamp per verified chain (:meth:`Calibration.followed`); a request's
history is "plain" unless its stamp is the decision just before.

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


# what the request's step before did: no verified chain, a chain cut short, a whole chain
HISTORIES = ("plain", "rejected", "whole")
PLAIN, REJECTED, WHOLE = range(3)


class Calibration:
    """Per position bucket, (accepted rows, predicted gains) of the drafted rows, engine-wide
    and per history, forgotten by ``decay`` per row observed there; ``scales(h)`` their
    ratios: engine-wide shrunk to 1, history ``h``'s own shrunk to that."""

    def __init__(self, decay: float = 0.005, prior: float = 1.0,
                 history_prior: float = 4.0) -> None:
        self.decay, self.prior, self.history_prior = decay, prior, history_prior
        self.sums: list[list[float]] = []  # bucket -> [accepted, predicted]
        # history -> bucket -> [accepted, predicted]
        self.by_history: list[list[list[float]]] = [[] for _ in HISTORIES]
        self._pooled: list[float] | None = None
        self._scales: list[list[float] | None] = [None] * len(HISTORIES)
        # req_id -> the history and gains its last decision priced its rows at (before
        # scaling)
        self.predicted: dict[str, tuple[int, list[float]]] = {}
        # req_id -> (the decision its last verified chain ran under, that chain's history)
        self.last: dict[str, tuple[int, int]] = {}

    def history(self, req_id: str, decision: int) -> int:
        """The request's history for ``decision``: its chain verified under the decision
        before, cut short or whole; else plain."""
        last = self.last.get(req_id)
        return last[1] if last is not None and last[0] == decision - 1 else PLAIN

    def followed(self, req_id: str, drafted: int, accepted: int, decision: int) -> None:
        """The request's chain of ``drafted`` drafts, the first ``accepted`` kept, verified
        under ``decision`` (the whole chain, whatever the counting rule counts)."""
        self.last[req_id] = (decision, WHOLE if accepted >= drafted else REJECTED)

    def priced(self, req_ids: list[str], gains: list[list[float]], decision: int,
               floor: float = 0.0) -> list[list[float]]:
        """A decision's gains per request (chain order), kept to be checked against the
        outcomes, returned scaled (:meth:`apply`) by each request's history."""
        out, predicted, last = [], self.predicted, self.last
        for req_id, own in zip(req_ids, gains):
            h = self.history(req_id, decision) if last else PLAIN
            predicted[req_id] = (h, own)
            out.append(self.apply(own, floor, h))
        return out

    def verified(self, req_id: str, drafted: int, accepted: int, counted: bool = True
                 ) -> None:
        """A chain's outcome, checked against the gains its request was last priced at;
        one the counting rule left out (``counted`` False: ``record_head``) checks the
        engine-wide price only."""
        predicted = self.predicted.get(req_id)
        if predicted and predicted[1]:
            self.observe(predicted[1][:drafted], accepted,
                         predicted[0] if counted else None)

    def forget(self, live: set[str]) -> None:
        for known in (self.predicted, self.last):
            for req_id in [r for r in known if r not in live]:
                del known[req_id]

    def observe(self, predicted: list[float], accepted: int, history: int | None = PLAIN
                ) -> None:
        """One verified chain: ``predicted`` the gains of its drafted rows (in chain order),
        the first ``accepted`` of them accepted; priced after ``history`` (None: checks the
        engine-wide price only)."""
        keep = 1.0 - self.decay
        books = (self.sums,) if history is None else (self.sums, self.by_history[history])
        for sums in books:
            for j, g in enumerate(predicted):
                b = _bucket(j)
                while len(sums) <= b:
                    sums.append([0.0, 0.0])
                s = sums[b]
                s[0] = s[0] * keep + (1.0 if j < accepted else 0.0)
                s[1] = s[1] * keep + g
        self._pooled = None
        self._scales = [None] * len(HISTORIES)

    def scales(self, history: int = PLAIN) -> list[float]:
        """Per bucket, accepted over predicted, shrunk to 1; then ``history``'s own ratio,
        shrunk to that (built once per observation)."""
        scales = self._scales[history]
        if scales is None:
            pooled = self._pooled
            if pooled is None:
                w = self.prior
                pooled = self._pooled = [(hits + w) / (predicted + w)
                                         for hits, predicted in self.sums]
            w, scales = self.history_prior, list(pooled)
            for b, (hits, predicted) in enumerate(self.by_history[history]):
                scales[b] = (hits + w * pooled[b]) / (predicted + w)
            self._scales[history] = scales
        return scales

    def apply(self, gains: list[float], floor: float = 0.0, history: int = PLAIN
              ) -> list[float]:
        """``gains`` scaled by position (after ``history``), capped at 1 and kept
        non-increasing, stopping before the first below ``floor``."""
        scales = self.scales(history)
        out, last, n, buckets = [], 1.0, len(scales), _BUCKETS
        for j, g in enumerate(gains):
            b = buckets[j] if j < 256 else position_bucket(j)
            scaled = g * scales[b] if b < n else g
            if scaled < last:
                last = scaled
            if last < floor:
                break
            out.append(last)
        return out

    def state(self) -> list:
        def rounded(sums: list[list[float]]) -> list:
            return [[round(h, 9), round(p, 9)] for h, p in sums]
        return [rounded(self.sums), [rounded(h) for h in self.by_history],
                sorted([r, d, h] for r, (d, h) in self.last.items())]
