"""When the speculation budget controller probes (``core/budget.py``): a backed-off schedule.

A probe runs a neighbour of the controller's choice for one step, so that the row counts it
is not choosing stay measured. Probes cost: a drafting probe where drafts do not pay spends a
step's worth of rows (and, for methods whose drafter runs a forward, the drafter), so a
controller that probes every ``probe_every`` steps where nothing ever changes loses a few per
cent for nothing (``specdiff`` at batch 8, sampling at T=0.8, a model whose drafts are never
accepted). The schedule therefore backs off:

* while the controller warms up (``warmup_steps`` measured steps) every other step probes;
* then the gap is ``probe_every * 2**e``. A probe after which the choice is still plain
  decoding raises e by one, up to ``max_backoff`` (drafts do not pay here, and each probe says
  so again). One that moved the choice (drafting switched on or off, rows changed by more
  than a quarter) sets e to -2, so the next probe comes in a quarter of the gap (a flat cost
  curve is climbed in a few probes, not one per ``probe_every``). One that left a drafting
  choice where it was sets e to 0: near its choice the controller keeps learning acceptance
  at the positions it does not draft, one probe's observation at a time;
* e is kept per batch size: what probes said at one size (a warm-up at batch 2 where drafts
  were rejected) does not postpone the first probes at another. A size never judged starts at
  e = 0: an engine's first batch at size 4 ran 64 steps plain, no probe, on the back-off its
  batch-2 warm-up had left (issue 22). Each size backs off on its own, so where drafting never
  pays a size costs its few probes once, not once per batch.

A probe whose batch size changed before it was judged judges nothing: its choice differs for
reasons of its own.
Which neighbour a probe runs is :class:`Explorer`'s call: no drafts (when the choice drafts),
or the nearest row count above the choice not measured lately (a quarter more rows, or twice
as many: at least one, or four, more drafts per request), held for ``probe_hold`` steps.

Everything here is a function of decisions and choices the controller made, so every TP rank,
fed the same measurements, keeps the same schedule.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from .budget_models import YOUNG_SAMPLES, StepCost, fixed_price
from .budget_rows import candidates
from .budget_settings import BudgetSettings


class Upside(NamedTuple):
    """What an upward probe from plain decoding may gain (:func:`priced_probe`)."""

    expected: Callable[[int], float | None]  # predicted tokens / s of r rows (goodput)
    best_case: Callable[[int], float | None]  # the same, every draft accepted
    price: float | None  # a step of one draft each at its fastest, in plain steps (None: unseen)
    plain: float  # predicted tokens / s of plain decoding
    need: float  # what a choice to draft must predict (plain, with the margin)


NEAR_BEST = 0.15  # a priced probe's count: the most predicted within this share of the best


def priced_probe(total: int, upside: Upside) -> int | None:
    """An upward probe from plain decoding where drafting has a fixed price: where a step of
    one draft per request could not beat plain decoding even if every draft were accepted
    (it costs two plain steps or more), the most drafts within ``total`` predicted within
    ``NEAR_BEST`` of the best count among those that could beat it if every draft were; None
    elsewhere (the nearest-count rule, whose first probes are one or two drafts).

    ``specdiff``'s drafter at batch 1 makes a drafting step 11.6-12.4 ms against 5.0-5.5 ms
    plain, at one draft as at four. Its one- and two-draft probes could not pay or barely:
    each lost, was owed to the books, and judged one or two positions, and a fresh engine
    ran plain for hundreds of steps (0.77-0.92 of four drafts fixed in its first round, eight
    engines). With this rule 0.77-0.96 in nine, a mean one to two points higher: the rest of
    that round's loss is elsewhere (issue 22; RESULTS, the fourteenth session).

    The most such drafts, not the fewest: a probe is how a position the controller stopped
    drafting to is judged again, and where the price is fixed deeper rows cost little. With
    the fewest within 5%, a position whose estimate had fallen low (a few looping requests,
    or a handful of rows in the warm-up: engine rate 0.27-0.32 and calibration 0.32-0.71
    where 0.6-0.8 were accepted) was never probed again, since two drafts then looked as good
    as four: traced ``specdiff`` engines at batch 1 ran 77-98% plain, and a simulated start
    (``tests/unit/core/test_budget_fixed_price.py``) stayed plain for 2,000 steps at 0.74 of
    four drafts fixed. A second drafter forward (``specdiff``'s stages past four drafts: 17
    ms a step against 12) prices itself out of the band unless its drafts are likely."""
    counts = candidates(total)
    if not counts or upside.price is None or not fixed_price(upside.price):
        return None
    hopes = [((upside.expected(r) or 0.0), r) for r in counts
             if (upside.best_case(r) or 0.0) > upside.need]
    if not hopes:
        return None
    most = max(value for value, _ in hopes)
    return max(r for value, r in hopes if value >= (1 - NEAR_BEST) * most)


def upside_of(search, margin: float, cost: StepCost, batch: int, prefix: list[float],
              depth: list[int]) -> Upside | None:
    """The :class:`Upside` at this batch size, from a controller's row search
    (``budget_search``: ``prefix``, expected accepted drafts of the first r rows; ``depth``,
    their deepest chain), its decision ``margin`` and its step prices; None before a plain
    step was priced."""
    plain = search.goodput(batch, 0, 0.0)
    if plain is None:
        return None
    price = cost.in_plain_steps(batch, batch, search.stage(1), search.seconds(batch, 0), True)
    return Upside(lambda r: search.goodput(batch, r, prefix[r], depth[r]),
                  lambda r: search.goodput(batch, r, r, depth[r]),
                  price, plain, plain * (1 + margin))


class ProbeSchedule:
    def __init__(self, probe_every: int, warmup_steps: int, max_backoff: int) -> None:
        self.probe_every, self.warmup_steps = max(1, probe_every), warmup_steps
        self.max_backoff = max_backoff
        self.backoff: dict[int, int] = {}  # e by batch size: the gap is probe_every * 2**e
        self.last = 0  # decision number of the last probe (any batch size)
        self.pending: tuple[int, int] | None = None  # (batch, choice) when it was taken

    def due(self, decision: int, measured: int, batch: int) -> bool:
        """A probe in this decision, at this batch size?"""
        if measured < self.warmup_steps:
            return decision % 2 == 0
        return decision - self.last >= self.gap(batch)

    def gap(self, batch: int) -> int:
        """Steps between probes at this batch size after warm-up, as things stand."""
        return max(1, round(self.probe_every * 2.0 ** self.backoff.get(batch, 0)))

    def started(self, decision: int, batch: int, choice: int, measured: int) -> None:
        """A probe is taken at ``decision``; the controller's own choice was ``choice``
        (warm-up probes are not judged)."""
        self.last = decision
        self.pending = (batch, choice) if measured >= self.warmup_steps else None

    def postpone(self, decision: int, batch: int) -> None:
        """The probe due at ``decision`` comes an eighth of its gap later (after warm-up)."""
        gap = self.gap(batch)
        self.last = decision - gap + max(1, gap // 8)

    def judge(self, batch: int, choice: int) -> None:
        """The first settled choice after a probe, at the probe's batch size: moved, the next
        probe comes soon; still plain, the gap doubles; still drafting, the base gap."""
        if self.pending is None:
            return
        before_batch, before = self.pending
        self.pending = None
        if before_batch != batch:
            return
        if (before > 0) != (choice > 0) or abs(choice - before) > max(1, before // 4):
            self.backoff[batch] = -2
        elif choice == 0:
            self.backoff[batch] = min(self.backoff.get(batch, 0) + 1, self.max_backoff)
        else:
            self.backoff[batch] = 0

    def state(self) -> list:
        return [sorted(self.backoff.items()), self.last, self.pending]


class Explorer:
    """The neighbour of the controller's choice a step probes, when :class:`ProbeSchedule`
    says a probe is due (``decision``: the controller's decision count; ``measured``: its
    measured steps)."""

    def __init__(self, settings: BudgetSettings, cost: StepCost) -> None:
        self.s, self.cost = settings, cost
        self.schedule = ProbeSchedule(settings.probe_every, settings.warmup_steps,
                                      settings.max_backoff)
        self.held: tuple[int, int, int] | None = None  # an upward probe: rows, batch, steps
        self.count = 0  # probes run

    def held_rows(self, batch: int, total: int) -> int | None:
        """This step's rows of a held upward probe; None without one (a new batch size
        ends it)."""
        if self.held is None:
            return None
        rows, held_batch, left = self.held
        self.held = (rows, batch, left - 1) if left > 1 and held_batch == batch else None
        return min(rows, total) if held_batch == batch and total else None

    def choose(self, best: int, reach: int, batch: int, decision: int, measured: int,
               upside: Callable[[], Upside | None] | None = None) -> tuple[int, bool]:
        """(rows, upward) of this step: the choice ``best`` unless a probe is due; then no
        drafts (every third probe of a drafting choice, where plain steps are not fresh) or
        the nearest stale row count above it within ``reach`` (``upward``: the caller lifts
        every request to one draft where that fits); from plain decoding where drafting has
        a fixed price, the count with the most upside (:func:`priced_probe`)."""
        self.schedule.judge(batch, best)
        if not self.schedule.due(decision, measured, batch):
            return best, False
        if reach <= 0:
            # a probe due where no row may be drafted (every request at its last token, the
            # books allowing none) comes an eighth of its gap later: taken here, it probed
            # nothing and the next came a whole gap later (at batch 1, requests of 128 plain
            # steps and a gap of 256, every probe fell on a request's last step and none ran
            # for thousands of steps: a replay of ``specdiff``); due every step till one
            # could run, no plain decision was kept (``specdiff`` at batch 4 decided afresh
            # every step, 227 us against 130; issue 22)
            self.schedule.postpone(decision, batch)
            return best, False
        self.count += 1
        self.schedule.started(decision, batch, best, measured)
        kind = self.count % 3
        if best > 0 and kind == 0:
            return (0 if self.stale(batch, False, decision, measured) else best), False
        priced = upside() if not best and upside is not None and \
            not self.s.cold_after_plain else None
        up = priced_probe(reach, priced) if priced is not None else None
        if up is None:
            up = self._up(best, reach, batch, kind == 2, decision, measured)
        if up is None:
            return best, False
        if self.s.probe_hold > 1:
            self.held = (up, batch, self.s.probe_hold - 1)
        return up, True

    def _up(self, best: int, total: int, batch: int, far: bool, decision: int,
            measured: int) -> int | None:
        """Draft rows of an upward probe: the first count above ``best`` whose cost was not
        measured lately, within twice the choice (at least four more drafts per request:
        ``far``) or a quarter more (at least one more per request), and within ``total``
        (the trust region); None when all of them are fresh. A far probe from plain decoding
        takes the last such count within two drafts each instead: the first was the smallest
        drafting step, one draft each, measured over and over; where drafting has a fixed
        cost (``assd``'s drafting forward cost as much at one draft each as at two, batch 16,
        AVX2) two each (1.18 tokens/ms against plain's 0.87) was never tried and the batch
        ran 62-84% plain at 0.92-0.97x no speculation (issue 22). From a drafting choice the
        first (on a knee-shaped cost the last cost a few plain steps a probe)."""
        # from plain: two drafts each, or the nearest stale count below (not for drafts cold
        # after plain steps, ``cold_after_plain``: a Jacobi iterate is refined only where
        # verified, so a deeper probe measured only its cost: a simulated batch of 4 fell
        # from 0.91 to 0.87 of the best fixed chain)
        outward = far and not best and not self.s.cold_after_plain
        span = 2 * batch if outward else max(best, 4 * batch) if far else max(best // 4, batch)
        counts = candidates(min(total, best + span))
        for r in (reversed(counts) if outward else counts):
            if r > best and self.stale(batch + r, True, decision, measured):
                return r
        return None

    def stale(self, rows: int, drafting: bool, decision: int, measured: int) -> bool:
        """Worth a probe: never measured, measured fewer than ``YOUNG_SAMPLES`` times (a first
        step at a new shape can be slow for reasons of its own, e.g. the kernels it builds,
        and would price that row count for ``stale_after`` steps), or not since ``stale_after``
        decisions (warm-up probes always run: the first measurements are what everything
        rests on)."""
        seen = self.cost.last_seen(rows, drafting)
        return seen is None or measured < self.s.warmup_steps or \
            self.cost.samples(rows, drafting) < YOUNG_SAMPLES or \
            decision - seen >= self.s.stale_after

    def state(self) -> list:
        return [self.held, self.schedule.state()]
