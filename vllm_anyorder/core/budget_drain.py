"""Closed batches: when nobody waits to take a finished request's place, what the batch costs is
the time to finish all of it, not its tokens per second (``core/budget.py``'s closed mode).

Plain decoding finishes a closed batch of equal requests together. The goodput rule gives draft
rows to the requests most likely to accept them, so those finish early and the rest run on at a
smaller batch; where a step costs about the same at any batch size (a small model on a CPU),
each of those tail steps costs a full step for fewer tokens, and the drafting's gain is spent
there (issue 22, ``assd`` at batch 8: 577 of 1,433 steps ran at batch 1-7, 3.40 s where the
full batch's plain speed would have taken 2.44 s; drafting every request 2 rows, 1.08-1.16x,
beat the goodput rule, 0.93-1.00x). In a closed batch the controller therefore

1. orders the rows in rounds (:func:`water_fill`): every request's j-th row before any
   request's (j+1)-th, and within a round first the request predicted to finish last, n_i /
   rho_i largest (n_i tokens left, rho_i = 1 + the gains of its rows so far: expected tokens
   per step). Pure water-filling (always the request predicted to finish last) sent chains
   of 8 to the requests that accept least, priced by engine-wide acceptance learnt on the
   requests that accept most: 2-11% of positions 4-8 accepted, 0.96x (issue 22); and
2. values the first r rows of that order by the predicted time to drain the batch if every
   request kept its rows (:func:`drain_seconds`): T = sum_k (f_k - f_{k-1}) * cost(rows of the
   requests still running), f the finish steps n_i / rho_i in ascending order, cost the
   measured step-cost curve (a drafting step of k requests from k requests' own drafting
   steps where there are some: ``budget_batch_prices``); the value is the batch's tokens
   left over T (plain decoding: rho = 1, no drafting rows), in the same unit as goodput.

With one request both reduce to the goodput rule (rho / cost). Whether a batch is closed is
:class:`BatchWatch`'s call, from the request ids of each step alone; :class:`ClosedBatch` holds
the controller's closed-batch state (a closed batch's decision is kept a few steps:
``budget_settings.KeptDecision``).
"""

from __future__ import annotations

import heapq
from typing import Callable


class BatchWatch:
    """Closed while no request joined since either every request of the batch joined in the
    same step (the start of an offline batch) or a request left ``grace`` steps ago with nobody
    taking its place (a server refills a freed seat within a step or two while requests wait;
    the end of a load, an offline batch's tail)."""

    def __init__(self, grace: int = 4) -> None:
        self.grace = grace
        self.joined: dict[str, int] = {}  # req_id -> step it joined
        self.step = 0
        self.left_at: int | None = None  # first departure since the last join
        # derived from ``joined``, kept until the batch changes: the batch as last observed,
        # whether its requests all joined in one step, and the last step one of them joined
        self._ids: list[str] = []
        self._together: bool | None = None
        self._newest = 0

    def observe(self, req_ids: list[str]) -> bool:
        """This step's batch; whether it is closed."""
        self.step += 1
        if req_ids != self._ids:  # the batch changed (else: nobody joined or left)
            self._ids, self._together = list(req_ids), None
            joined, new = self.joined, False
            for req_id in req_ids:
                if req_id not in joined:
                    joined[req_id] = self.step
                    new = True
            if len(joined) != len(req_ids):  # someone left
                live = set(req_ids)
                for req_id in [r for r in joined if r not in live]:
                    del joined[req_id]
                if self.left_at is None:
                    self.left_at = self.step
            self._newest = max(joined.values(), default=0)
            if new:
                self.left_at = None
                return False
        if self.left_at is not None and self.step - self.left_at >= self.grace:
            return True
        if self._together is None:
            steps = iter(self.joined.values())
            first = next(steps, None)
            self._together = first is not None and all(s == first for s in steps)
        return self._together

    def age(self, req_id: str) -> int:
        """Steps the request has been in the batch, this one included (0: not seen)."""
        joined = self.joined.get(req_id)
        return 0 if joined is None else self.step - joined + 1

    def young(self, req_ids: list[str], steps: int) -> int:
        """How many of these requests are at most ``steps`` steps old (:meth:`age`)."""
        if req_ids == self._ids and self.step - self._newest + 1 > steps:
            return 0  # the observed batch, all older (the usual case: one comparison)
        return sum(1 for r in req_ids if self.age(r) <= steps)

    def state(self) -> list:
        return [self.step, self.left_at, sorted(self.joined.items())]


class ClosedBatch:
    """The controller's closed-batch state: the watch, and the tokens left it asks for."""

    def __init__(self) -> None:
        self.watch = BatchWatch()
        # the last request left of a closed batch (its tail; not a request that came alone):
        # decided by the goodput rule, and kept as a closed batch's decision is
        self.alone = False

    def tokens_left(self, req_ids: list[str],
                    remaining: Callable[[], list[int] | None] | None) -> list[int] | None:
        """This step's tokens left per request where the batch is closed (and has two requests
        or more: with one, both rules agree); None: open or unknown. ``remaining`` is only
        called for a closed batch."""
        closed = self.watch.observe(req_ids)
        self.alone = closed and len(req_ids) == 1 and self.watch.left_at is not None
        if not closed or remaining is None or len(req_ids) < 2:
            return None
        return remaining()

    def state(self) -> list:
        return self.watch.state()


def water_fill(remaining: list[int], gains: list[list[float]],
               most: int) -> list[tuple[float, int]]:
    """Up to ``most`` rows as (gain, batch row) in rounds: the requests with the fewest rows
    so far first, among them the one predicted to finish last (``gains[i]``: request i's row
    gains in chain order, none past its limit; ties to the lower row, so every TP rank orders
    alike)."""
    rate = [1.0] * len(remaining)
    used = [0] * len(remaining)
    heap = [(0, -n, i) for i, n in enumerate(remaining) if gains[i]]
    heapq.heapify(heap)
    order: list[tuple[float, int]] = []
    while heap and len(order) < most:
        i = heap[0][2]
        g = gains[i][used[i]]
        used[i] += 1
        rate[i] += g
        order.append((g, i))
        if used[i] < len(gains[i]):  # its next row: one sift instead of a pop and a push
            heapq.heapreplace(heap, (used[i], -remaining[i] / rate[i], i))
        else:
            heapq.heappop(heap)
    return order


def round_ends(order: list[tuple[float, int]]) -> set[int]:
    """Row counts r at which the first r rows of a :func:`water_fill` order end a round (every
    request with a j-th row has it)."""
    used: dict[int, int] = {}
    rounds = []
    for _, i in order:
        rounds.append(used.get(i, 0))
        used[i] = rounds[-1] + 1
    return {r for r in range(1, len(order) + 1)
            if r == len(order) or rounds[r] > rounds[r - 1]}


def drain_seconds(remaining: list[int], rate: list[float], rows: list[int],
                  seconds_of: Callable[[int, bool], float | None],
                  own: Callable[[int, int], float | None] | None = None) -> float | None:
    """Predicted seconds until every request finished, each keeping ``rows[i]`` draft rows and
    committing ``rate[i]`` tokens per step; ``seconds_of(rows, drafting)`` prices one step of
    that many rows (None: unknown, and so is the drain); ``own(requests, rows)``: a drafting
    step's price from that batch size's own steps, where it has some
    (``budget_batch_prices.BatchPrices``; None: ``seconds_of``'s)."""
    finish = sorted(zip([n / r for n, r in zip(remaining, rate)], rows))
    running, drafts, alive = len(remaining) + sum(rows), sum(rows), len(remaining)
    total, before = 0.0, 0.0
    for steps, kept in finish:
        if steps > before:
            seconds = own(alive, running) if own is not None and drafts else None
            if seconds is None:
                seconds = seconds_of(running, drafts > 0)
            if seconds is None:
                return None
            total += (steps - before) * seconds
            before = steps
        running -= 1 + kept
        drafts -= kept
        alive -= 1
    return total


class DrainValue:
    """Value of drafting the first r rows of a water-filled ``order``: the batch's tokens left
    over the predicted drain time (tokens / s, comparable with goodput). One per decision: the
    step prices come as tables (``tables(drafting, depth)``: seconds by row count 0..rows, None
    before a measurement), and the rows of ascending r are added on, not recounted."""

    def __init__(self, remaining: list[int], order: list[tuple[float, int]],
                 tables: Callable[[bool, int], list[float] | None], depth: list[int],
                 own: Callable[[int, int, int], float | None] | None = None) -> None:
        """``own(requests, rows, depth)``: a drafting step's price from that batch size's own
        steps (None: the tables')."""
        self.remaining, self.order, self.depth = remaining, order, depth
        self.tables, self.own = tables, own
        self.tokens = float(sum(remaining))
        self._memo: dict[int, float | None] = {}
        self._upto, self._rate, self._rows = 0, [1.0] * len(remaining), [0] * len(remaining)

    def __call__(self, r: int) -> float | None:
        if r in self._memo:
            return self._memo[r]
        if r < self._upto:  # a smaller r after a larger one: count again
            self._upto, self._rate = 0, [1.0] * len(self.remaining)
            self._rows = [0] * len(self.remaining)
        rate, rows = self._rate, self._rows
        for g, i in self.order[self._upto: r]:
            rate[i] += g
            rows[i] += 1
        self._upto = max(self._upto, min(r, len(self.order)))
        plain = self.tables(False, 0)
        depth = self.depth[min(r, len(self.depth) - 1)]
        drafting = self.tables(True, depth) if r else plain
        own, own_of = self.own, None
        if own is not None and r:
            def own_of(requests: int, n: int) -> float | None:
                return own(requests, n, depth)
        value = None
        if plain is not None and drafting is not None:
            seconds = drain_seconds(self.remaining, rate, rows,
                                    lambda n, d: drafting[n] if d else plain[n], own_of)
            value = self.tokens / seconds if seconds and self.tokens else None
        self._memo[r] = value
        return value


def thin(rows: list[int], batch: int) -> list[int]:
    """A closed batch's candidate row counts: each drain is O(batch), so past four rows only
    every ``batch // 4``-th count (and the last) is valued."""
    stride = max(1, batch // 4)
    return [r for r in rows if r <= 4 or r % stride == 0 or r == rows[-1]]


def on_grid(rows: int, batch: int) -> int:
    """The nearest count at or below ``rows`` that :func:`thin` keeps at every length.

    The hysteresis anchor of a closed batch is one: an anchor off the grid (an open step's
    choice, the batch's first, of 33 rows at batch 16: two drafts each and one more) was
    held through the whole batch, as the search never valued the grid's 32 far enough above
    it, while its 49 rows cost 0.2-0.4 ms (3-8%) more than 48 on a CPU whose matrix tiles
    hold 16 rows (issue 22, ``jacobi``: a third of a batch's full steps)."""
    stride = max(1, batch // 4)
    return rows if rows <= 4 else rows - rows % stride
