"""The speculation budget: how many drafts each request gets in the next step (zero included).

Every method drafts "up to its configured size"; whether those rows pay depends on the machine,
the load and how often this model's drafts are accepted. The controller chooses, each engine
step, the draft rows R of the whole batch that maximise expected committed tokens per second,
from what it measured itself (``budget_models``, ``budget_accept``): goodput(R) = (B + sum of
the R largest gains) / cost(B + R rows), with B the requests of the batch (each commits one
token anyway), the gains g_{i,j} = prod_{m<=j} a_{i,m} the expected accepted drafts the j-th
row of request i adds (checked against what drafted rows accepted, position by position, and
scaled to match: ``core/budget_calibration``), and cost the measured step time (R = 0: the
plain-decoding arm). Rows go to the requests whose next draft is most likely accepted; R = 0
is plain decoding, which makes the method never slower than no speculation once the
measurements are in (the SmartSpec / TurboSpec goodput rule, with measured rather than
profiled cost and per-position acceptance). The searches over R: ``core/budget_search``.

Closed batches (``core/budget_drain``): while nobody waits to take a finished request's place
(an offline batch, the end of a load), rows go to the requests furthest from finishing and an
allocation is valued by the predicted time to finish the whole batch: drafting that lets some
requests finish early only moves the rest into a tail of small, nearly full-price steps (only
where some row count pays at the full batch by the goodput rule; elsewhere no drain is valued).

Outputs do not depend on it: drafts are guesses and every method verifies them exactly, so
any allocation, in any step, commits the same tokens (tested with the ``cycle`` hook).

Modes (``"budget"`` beside each method's options): ``auto`` (this controller), ``fixed`` (the
configured sizes every step), ``cycle:a,b,...`` (test hook: per-request caps a, b, ... in turn,
step by step, to switch sizes mid-request).

Exploration: a step verifies at most twice the rows of the widest drafting step measured at
its batch size or a larger one (``budget_rows.TrustRegion``), so rows grow by doubling.
A measurement is only taken where the controller drafts, so now and then it probes a
neighbour of its choice (no drafts when it drafts; a quarter more rows; twice the rows; at
least one draft per request): often while it warms up, then every ``probe_every`` steps,
backed off, per batch size, where probes keep leaving the choice where it was
(``core/budget_probes``). A new choice must beat the current one by ``hysteresis`` before
the controller switches, so noise does not flap the decision.
Reality check (``core/budget_reality``): where the drafting steps it chose at a batch size
really committed fewer tokens per second than plain steps did, it stops drafting there, and
tries again once that figure is stale (not for drafts cold after plain steps, Jacobi's); and
where a lone request's drafting steps really committed more than plain steps did, by the
margin, a prediction to stop drafting is overruled (``RealityCheck.paying``).
The books (``core/budget_guard``): drafting, chosen or probed, runs only while the net time
the drafting steps lost against plain decoding (for the tokens they committed) is within
``loss_share`` of the measured time, and a step drafts no more rows than it could lose
within what is left of that share if it accepted nothing, so no error of the models costs
more than that share (up to the cost model's error on one step). A row count's first drafting
step is charged what the model predicted for it: building its kernels is a one-off.
"""

from __future__ import annotations

from typing import Callable

from .budget_accept import Acceptance
from .budget_backlog import HeldRecords, PlainBacklog
from .budget_records import BudgetRecords
from .budget_batch_prices import BatchPrices
from .budget_calibration import Calibration
from .budget_drain import ClosedBatch, DrainValue, on_grid, water_fill
from .budget_guard import LossGuard
from .budget_models import StepCost, fixed_price
from .budget_probes import Explorer, upside_of
from .budget_reality import RealityCheck
from .budget_report import describe, fingerprint
from .budget_rows import TrustRegion, caps_of, deepest, prefix_sums, probe_caps, ranked_rows
from .budget_search import RowSearch
from .budget_settings import BudgetSettings, Decision, KeptDecision, parse_mode
from .budget_switch import SwitchCost

MIN_GAIN = 1e-3  # rows expected to add fewer accepted drafts than this are never worth one


class BudgetController(BudgetRecords):
    """Per-step draft allocation from measured step cost and acceptance (engine-free); what
    it learns from each step: ``budget_records.BudgetRecords``."""

    def __init__(self, settings: BudgetSettings,
                 stages: Callable[[int], int] | None = None) -> None:
        """``stages``: drafter forwards a step with this deepest chain runs (methods whose
        drafting work grows with depth, ``specdiff``); None: one, whatever the depth."""
        self.s = settings
        self.kind, self.cycle = parse_mode(settings.mode)
        self.cost = StepCost()
        self.switch = SwitchCost()  # what a step that changes arm costs more (budget_switch)
        self.prices = BatchPrices()  # drafting prices per batch size (budget_batch_prices)
        self.search = RowSearch(self.cost, stages, self.prices)  # prices, row-count searches
        self.accept = Acceptance(settings.max_drafts)
        self.calibration = Calibration()  # predictions checked against outcomes by position
        self.reality = RealityCheck(settings.stale_after, settings.cold_after_plain,
                                    settings.margin)
        self.trust = TrustRegion()
        self.guard = LossGuard(settings.loss_share, settings.loss_horizon)
        self.closed = ClosedBatch()  # closed batches (budget_drain)
        self.accept.age_of = self.closed.watch.age  # its watch sees every step's batch
        self.accept.young_of = self.closed.watch.young
        self.kept = KeptDecision(settings.closed_hold)  # a decision used a few steps
        self.measured = 0  # steps whose cost was measured
        self.after_drafting: int | None = None  # measured steps since drafting (budget_measure)
        self._shapes: set[int] = set()  # row counts a drafting step has run at
        self.decisions = 0
        self.chosen = (0, 0)  # R of the last non-probe decision and its batch (hysteresis)
        self.last = Decision()
        self.explore = Explorer(settings, self.cost)  # probes (budget_probes)
        # plain steps' bookkeeping held back while the decision is to draft nothing, replayed
        # before anything reads it (budget_backlog): ``_holding`` while that decision stands
        self.backlog = PlainBacklog()
        self._holding = False
        # and a kept decision to draft, once reused (its books were read when it was decided
        # and at its first reuse), holds its steps' records back till the next fresh
        # decision (``held``; ``defer_records``: a test hook)
        self._kept_drafting = False
        self.defer_records = True
        self.held = HeldRecords()
        self.totals = {"steps": 0, "steps_without_drafts": 0, "drafted": 0, "accepted": 0,
                       "probes": 0, "guarded": 0, "stalls": 0}

    @property
    def stages(self) -> Callable[[int], int] | None:
        """Drafter forwards by deepest chain (None: one); the row search holds it."""
        return self.search.stages

    def set_mode(self, mode: str) -> None:
        """Switch the mode of a live controller (a test and benchmark hook:
        ``benchmarks/bench_switch.py``); what ``auto`` learnt is kept."""
        self.flush()
        self._holding = self._kept_drafting = False
        self.kind, self.cycle = parse_mode(mode)

    # ------------------------------------------------------------------ decisions
    def allot(self, req_ids: list[str], limits: list[int],
              remaining: Callable[[], list[int] | None] | None = None) -> list[int]:
        """Drafts per request for the next step (<= each limit); ``limits`` already holds each
        request's own bound (room left, configured size; 0 for a request that cannot draft;
        never negative);
        ``remaining()``: the tokens each request has left at most, asked only where the batch
        is closed (None, or it returns None: unknown; then the closed-batch rule of
        ``budget_drain`` does not apply)."""
        if self.kind == "fixed":
            caps = list(limits)
        elif self.kind == "cycle":
            c = self.cycle[self.totals["steps"] % len(self.cycle)]
            caps = [min(c, lim) for lim in limits]
        else:
            # ``auto``'s clock (ages, staleness) counts its own steps only: a controller
            # switched to another mode and back (set_mode) finds its figures as it left them
            self.decisions += 1
            caps = self._auto(req_ids, limits, remaining)
        plain = not any(caps)
        if self.kind == "auto":  # requests without drafts: their own counts fade
            self._holding = plain
            if plain:  # (budget_backlog: when something reads them)
                if self.held:
                    self.flush()
                self.backlog.hold_relax(req_ids, self.accept.relax_steps)
            elif self._holds():
                if 0 in caps:
                    self.held.ops.append((HeldRecords.RELAX, list(req_ids), list(caps)))
            else:
                self.flush()
                self.accept.relax_plain(req_ids, caps)
        self.totals["steps"] += 1
        self.totals["steps_without_drafts"] += plain
        self.last.caps = caps
        return caps

    def _auto(self, req_ids: list[str], limits: list[int],
              remaining: Callable[[], list[int] | None] | None) -> list[int]:
        batch = len(req_ids)
        # a closed batch is valued by the time to finish it (budget_drain); one request: same
        left = self.closed.tokens_left(req_ids, remaining)
        closed = left is not None
        young = self.accept.young(req_ids)
        # a decision kept a few steps (KeptDecision): a closed batch's, its last request's,
        # and a lone request's (batch 1, ``closed_hold`` steps: not growing with repeats)
        grow = closed or self.closed.alone
        keeps = grow or batch == 1
        reused = self._kept_drafting
        held = self.kept.reuse(req_ids, limits, keeps,
                               lambda plain: self._may_keep(batch, plain, reused), young)
        self._kept_drafting = held is not None and any(held)
        if held is not None:
            return held
        self.flush()  # deciding afresh reads everything the backlog holds
        plain = self.search.goodput(batch, 0, 0.0)
        if plain is None:  # nothing measured yet: plain decoding first, then grow from it
            self.last = Decision(0, batch, True)
            return [0] * batch
        # the trust region (budget_rows.TrustRegion) bounds choices and probes alike
        reach = self.trust.reach(batch)
        # each request's, in chain order; a drain forecasts finishes dozens of steps off, which
        # a request's last few steps mislead: its class's rates there (Acceptance.gains)
        own = self._gains(req_ids, limits, reach, personal=not closed)
        order = water_fill(left, own, reach) if closed else ranked_rows(own, reach)  # best first
        gains = [g for g, _ in order]
        prefix = prefix_sums(gains)
        depth = deepest(order, batch)
        # a drain is valued only where some row count pays at the full batch by the goodput
        # rule: where none does (drafts rarely accepted, T = 0.8) the drains' valuation was
        # 180 us of every step for nothing (issue 22)
        need = plain * (1 + self.s.margin)
        drain = closed and self.search.may_pay(batch, prefix, depth, len(order), need)
        if drain:
            tables = self.cost.price_tables(batch + len(order), self.search.stage)
            value = DrainValue(left, order, tables, depth, self.search.drain_prices(tables))
            plain = value(0) or plain  # valued in drain time from here on
            need = plain * (1 + self.s.margin)
        else:
            def value(r: int) -> float | None:
                return self.search.goodput(batch, r, prefix[r], depth[r])
        # no more rows than the books can lose if none is accepted (budget_guard)
        if self.guard.keeping and batch not in self.guard.books:  # opened from a bound
            self.guard.open(batch, self.cost.baseline(batch))  # (StepCost.baseline)
        room, trusted = self.guard.allowance(batch), min(len(order), reach)
        reach = self.search.affordable(batch, trusted, depth, room)
        if drain:
            best, best_val = self.search.best_drain(batch, order[:reach], value, reach, plain, need)
        elif closed and reach == len(order):  # the gate's search was this one: nothing pays
            best, best_val = 0, plain
        else:
            best, best_val = self.search.best_open(batch, prefix, depth, reach, plain, need)
        order = order[:reach]
        # the anchor keeps its rows per request: a closed batch's tail that held the rows
        # chosen at 16 requests drafted 8-deep chains at 6 (issue 22)
        rows, at = self.chosen
        anchor = min(round(rows * batch / at) if at else 0, len(order))
        if drain:  # only counts the drain search values (an open step's 33 at batch 16: 49
            anchor = on_grid(anchor, batch)  # rows, 0.2-0.4 ms over 48, held; issue 22)
        anchor_val = value(anchor) or 0.0
        # hysteresis holds the current choice only while it is predicted no slower than
        # plain decoding: "never slower than no speculation" outranks "do not flap"; leaving
        # drafting for plain also pays the round trip of switching arm (budget_switch)
        stay, least = self.s.hysteresis, plain
        if not best and anchor and self.switch.last:
            trip = self.switch.round_trip_share(self.search.seconds(batch, 0))
            stay, least = max(stay, trip), plain / (1 + trip)
        if best != anchor and best_val < anchor_val * (1 + stay) and \
                anchor_val >= least and not self.search.free_switch(batch, anchor, best, depth):
            best, best_val = anchor, anchor_val
        if not best:  # a lone request's drafting steps that paid in reality (budget_reality)
            keep = min(self.reality.paying(batch, self.decisions), reach)
            # a count cut by the request's end or the books, not one that cannot pay even
            # if every draft is accepted (``specdiff``'s one draft: 2.3 plain steps; traced at
            # batch 1, 14-19 such steps an engine, each a sure loss; issue 22)
            if keep and self.search.could_pay(batch, keep, depth[keep], need):
                best, best_val = keep, value(keep) or plain
        lost = bool(best) and self.reality.lost(batch, self.decisions)
        if lost:  # reality overrules the prediction
            best, best_val = 0, plain
        allowed = room >= 0  # the books overrule everything (budget_guard)
        if best and not allowed:
            best, best_val = 0, plain
            self.totals["guarded"] += 1
        elif not lost and best == reach < trusted and (value(reach + 1) or 0.0) > best_val:
            # the books' row bound held back one more predicted-better row
            self.totals["guarded"] += 1
        self.chosen = (best, batch)
        self.reality.chose(batch, best)
        if not allowed:  # a plain step: no held probe, no probe; the decision says why
            self.explore.held = None
            self.last = Decision(0, batch, False, best_val, plain, guarded=True, closed=closed)
            self.kept.keep(req_ids, [0] * batch, keeps, young)
            return [0] * batch
        held = self.explore.held_rows(batch, len(order))
        if held is not None:  # an upward probe holding its row count
            return self._probe_caps(order, held, limits, best_val, plain, reach)
        probes = self.explore.count
        rows, up = self.explore.choose(best, reach, batch, self.decisions, self.measured,
                                       lambda: upside_of(self.search, self.s.margin, self.cost,
                                                         batch, prefix, depth))
        self.totals["probes"] += self.explore.count - probes
        if up:  # the nearest row count above the choice not measured lately
            return self._probe_caps(order, rows, limits, best_val, plain, reach)
        probe = rows != best  # no drafts, where plain steps are not fresh
        self.last = Decision(rows, batch, probe, best_val, plain, closed=closed, lost=lost)
        caps = caps_of(order, rows, batch)
        if not probe and (keeps or not rows):  # kept a few steps (KeptDecision.reuse)
            # a lone request's choice to draft, only where such a step was measured (three
            # times) at under two plain steps, so a kept choice that turned bad costs little;
            # a ``specdiff`` drafting step (13 ms against 4.9 ms plain) never qualifies, and
            # ``specdiff`` decides as it did before lone choices were kept (issue 22)
            price = self.cost.in_plain_steps(batch, rows, self.search.stage(depth[rows]),
                                             self.search.seconds(batch, 0))
            if grow or not rows or (price is not None and not fixed_price(price)):
                self.kept.keep(req_ids, caps, keeps, young, grow or not rows)
        return caps

    def _may_keep(self, batch: int, plain: bool, reused: bool = False) -> bool:
        """A kept decision may be used again (``KeptDecision.reuse``): no upward probe is held
        and no probe is due; to draft, also the books allow drafting at this batch size and
        reality has not turned against drafting there, as checked when it was decided and at
        its first reuse (``reused``: reused before; then its steps' records are held back,
        and the books are next read at the next fresh decision, within ``closed_hold`` to 15
        steps)."""
        probe_due = self.explore.schedule.due(self.decisions, self.measured, batch)
        if self.explore.held is not None or probe_due:
            return False
        if plain or reused:
            return True
        self.flush()  # the books and the realised rates
        return self.guard.allows(batch) and not self.reality.lost(batch, self.decisions)

    def _probe_caps(self, order: list[tuple[float, int]], rows: int, limits: list[int],
                    best_val: float, plain: float, most: int) -> list[int]:
        """An upward probe's caps (``budget_rows.probe_caps``), recorded as a probe."""
        caps = probe_caps(order, rows, limits, most)
        self.last = Decision(sum(caps), len(limits), True, best_val, plain)
        return caps

    def _gains(self, req_ids: list[str], limits: list[int], most: int,
               personal: bool = True) -> list[list[float]]:
        """Each request's row gains in chain order, up to its limit and ``most``: the
        acceptance model's (``personal``: with the request's own counts), kept to be checked
        against the outcomes, scaled as that check found them (``budget_calibration``)."""
        raw = [self.accept.gains(req_id, min(limit, most), MIN_GAIN, personal)
               for req_id, limit in zip(req_ids, limits)]
        return self.calibration.priced(req_ids, raw, MIN_GAIN)

    def summary(self) -> str:
        """One line, in words, of what the controller chose and why (the periodic log)."""
        self.flush()
        return describe(self)

    def state(self) -> dict:
        """Everything a decision depends on (TP ranks must agree; diagnostics fingerprint)."""
        self.flush()
        return fingerprint(self)
