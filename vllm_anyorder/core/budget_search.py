"""The row-count searches of one ``auto`` decision of the speculation budget
(``core/budget.py``), on the step-cost model's predicted prices (``budget_models.StepCost``):
the goodput rule (an open batch's choice, and a closed batch's gate), a closed batch's drain
search (``budget_drain``), the most rows the books afford (``budget_guard``), and whether more
rows cost nothing more (hysteresis need not wait)."""

from __future__ import annotations

import math
from typing import Callable

from .budget_batch_prices import BatchPrices
from .budget_drain import round_ends, thin
from .budget_models import StepCost
from .budget_rows import candidates


class RowSearch:
    """A step's predicted price at a batch size, row count and depth, and the searches over
    row counts that use it (engine-free; shares the controller's cost model)."""

    def __init__(self, cost: StepCost, stages: Callable[[int], int] | None = None,
                 prices: BatchPrices | None = None) -> None:
        """``stages``: drafter forwards a step with this deepest chain runs (methods whose
        drafting work grows with depth, ``specdiff``); None: one, whatever the depth;
        ``prices``: drafting prices per batch size, where measured (``budget_batch_prices``;
        elsewhere the cost model's)."""
        self.cost = cost
        self.stages = stages
        self.prices = prices
        self._stage_of: dict[int, int] = {}  # stages(depth), cached (the same every step)
        self._falls_of: dict[int, Callable[[int], float | None]] = {}  # _falls, by stage

    def stage(self, depth: int) -> int:
        if self.stages is None or depth <= 0:
            return 1
        stage = self._stage_of.get(depth)
        if stage is None:
            stage = self._stage_of[depth] = self.stages(depth)
        return stage

    def seconds(self, batch: int, rows: int, depth: int = 0) -> float | None:
        """Predicted seconds of a step at this batch size with ``rows`` draft rows (None
        before any measurement)."""
        if rows:
            seconds = self.drafting(batch, batch + rows, self.stage(depth))
        else:
            seconds = self.cost.predict(batch, False)
        return seconds if seconds is not None and seconds > 0 else None

    def drafting(self, batch: int, rows: int, stage: int = 1) -> float | None:
        """A drafting step of ``batch`` requests and ``rows`` rows in all: from that batch
        size's own drafting steps where there are some, else the cost model's curve."""
        def pooled(n: int) -> float | None:
            return self.cost.predict(n, True, stage)
        own = self.prices.price(batch, rows, stage, pooled, self._falls(stage)) \
            if self.prices else None
        return own if own is not None else pooled(rows)

    def _falls(self, stage: int) -> Callable[[int], float | None]:
        """The pooled drafting curve as a batch size's lone point falls along it
        (``BatchPrices.price``): down to the drafting arm's fewest rows measured, below them
        a drafting row's cost (``StepCost.row_slope``), not down to the plain steps the curve
        is anchored on there: that fall is drafting's fixed price, not rows'. A lone request's
        one-draft ``specdiff`` step, below its one point (four drafts, 13.9 ms), fell along
        the jump from a batch-2 warm-up's drafting steps (4-10 rows, 14-17 ms) to its plain
        steps (6.6 ms at 2 rows): priced 5 ms, it took 13-19 ms, and was chosen and probed
        first at batch 1 at a loss the books could not carry (issue 22). One per stage, built
        once: it reads the cost model when called (asked only below a lone point), and the
        price look-ups run dozens of times a decision."""
        built = self._falls_of.get(stage)
        if built is not None:
            return built

        def falls(n: int) -> float | None:
            low = self.cost.lowest(True, stage)
            if low is None or n >= low:
                return self.cost.predict(n, True, stage)
            at = self.cost.predict(int(math.ceil(low)), True, stage)
            return None if at is None else at - self.cost.row_slope(stage) * (low - n)
        self._falls_of[stage] = falls
        return falls

    def drain_prices(self, tables: Callable[[bool, int], list[float] | None]
                     ) -> Callable[[int, int, int], float | None] | None:
        """:meth:`drafting`'s own-batch part for a closed batch's drain, by (requests, rows,
        depth): None where that batch size has no price of its own (the drain then reads
        ``tables``, the cost model's curve as a table, whose rise also extends the prices)."""
        if self.prices is None:
            return None
        price, stage = self.prices.price, self.stage

        def own(requests: int, rows: int, depth: int) -> float | None:
            def pooled(n: int) -> float | None:  # asked only past the batch size's points
                table = tables(True, depth)
                return table[n] if table is not None and n < len(table) else None
            return price(requests, rows, stage(depth), pooled, self._falls(stage(depth)))
        return own

    def goodput(self, batch: int, rows: int, gain: float, depth: int = 0) -> float | None:
        seconds = self.seconds(batch, rows, depth)
        return None if seconds is None else (batch + gain) / seconds

    def could_pay(self, batch: int, rows: int, depth: int, need: float) -> bool:
        """Whether ``rows`` draft rows could predict ``need`` tokens per second at this batch
        size if every draft were accepted (the best case; unknown price: no)."""
        return (self.goodput(batch, rows, float(rows), depth) or 0.0) >= need

    def may_pay(self, batch: int, prefix: list[float], depth: list[int], most: int,
                need: float) -> bool:
        """Whether some row count up to ``most`` predicts at least ``need`` tokens per second
        at this batch size (the goodput rule's search, used as a closed batch's gate; it stops
        at the first such count: searching on for the best was a fifth of a closed decision)."""
        return self.best_open(batch, prefix, depth, most, 0.0, need, first=True)[0] > 0

    def best_open(self, batch: int, prefix: list[float], depth: list[int], most: int,
                  plain: float, need: float, first: bool = False) -> tuple[int, float]:
        """The goodput rule: the row count up to ``most`` with the most predicted tokens per
        second (``batch + prefix[r]`` over the step's predicted seconds), if that is at least
        ``need`` and above ``plain``; else (0, plain). ``first``: the first such count."""
        best, best_val, ceiling = 0, plain, batch + prefix[most]
        for r in candidates(most):
            seconds = self.seconds(batch, r, depth[r])
            if seconds is None:
                continue
            if self.stages is None and ceiling / seconds < max(need, best_val * (1 + 1e-9)):
                break  # no more rows can win: gains at most ``ceiling``, cost never falls
            val = (batch + prefix[r]) / seconds
            if val > best_val * (1 + 1e-9) and val >= need:
                best, best_val = r, val
                if first:
                    break
        return best, best_val

    def best_drain(self, batch: int, order: list[tuple[float, int]],
                   value: Callable[[int], float | None], most: int, plain: float,
                   need: float) -> tuple[int, float]:
        """A closed batch's search: the first ``r`` rows of the water-filled ``order`` with the
        most predicted tokens over its drain time (``value``), at least ``need``. Two passes:
        the round ends (and the first few counts) until the value falls away, then the
        thinned counts (``budget_drain.thin``) within the rounds next to the best of them
        (every count in every round was valued before: at batch 4 ~40 drains a decision, a
        third of a drafting step's plugin time; the partial rounds away from the best round
        end predicted no better, issue 22)."""
        ends = round_ends(order)
        grid = sorted(set(thin(candidates(most), batch)) | ends)
        coarse = [r for r in grid if r <= 4 or r in ends]
        best, best_val, worse = 0, plain, 0
        for r in coarse:
            val = value(r)
            if val is None:
                continue
            if val > best_val * (1 + 1e-9) and val >= need:
                best, best_val, worse = r, val, 0
            elif best and val < best_val and r in ends:
                # a drain's value peaks where rounds end (a partial round sends some requests
                # into the tail early) and falls from round to round past its best (gains
                # concave, costs rising): three round ends past it end the search (counting
                # every count stopped at the partial rounds past a one-draft round: 0.87x at
                # batch 16 against 1.03x for two drafts each, issue 22)
                worse += 1
                if worse == 3:
                    break
        if not best:
            return best, best_val
        at = coarse.index(best)
        lo = coarse[at - 1] if at else 0
        hi = coarse[at + 1] if at + 1 < len(coarse) else best
        valued = set(coarse)
        for r in grid:
            if lo < r < hi and r not in valued:
                val = value(r)
                if val is not None and val > best_val * (1 + 1e-9) and val >= need:
                    best, best_val = r, val
        return best, best_val

    def affordable(self, batch: int, most: int, depth: list[int], room: float) -> int:
        """The most draft rows (<= ``most``) a step at this batch size may verify: if it
        accepted none of them, it would lose no more than ``room`` seconds, what the books
        allow (``LossGuard.allowance``; priced by the cost model, never falling with rows)."""
        plain = self.cost.predict(batch, False)
        if room == math.inf or plain is None:
            return most
        seconds = self.drafting(batch, batch + most, self.stage(depth[most]))
        if seconds is not None and seconds - plain <= room:
            return most  # the usual case, where the books are far from binding: one price
        lo, hi = 0, most  # lo rows are affordable
        while lo < hi:
            mid = (lo + hi + 1) // 2
            seconds = self.drafting(batch, batch + mid, self.stage(depth[mid]))
            if seconds is not None and seconds - plain <= room:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def free_switch(self, batch: int, anchor: int, best: int, depth: list[int]) -> bool:
        """More rows at no predicted extra cost (a flat cost curve): no reason to wait."""
        if best < anchor or anchor == 0:
            return False
        more = self.drafting(batch, batch + best, self.stage(depth[best]))
        less = self.drafting(batch, batch + anchor, self.stage(depth[anchor]))
        return more is not None and less is not None and more <= less
