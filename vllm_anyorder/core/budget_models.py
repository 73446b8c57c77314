"""What the speculation budget controller measures: step cost against rows (acceptance:
``budget_accept``; the realised rates: ``budget_reality``).

The model is fed by the engine's own steps (``core/budget.py`` decides from it); it does not
import torch or vLLM. Every number they hold came from a measured step: nothing here is a
hand-set constant of the machine.

* :class:`StepCost` -- wall seconds of one engine step as a function of the rows the target
  verifies (``rows`` = requests + drafts) and whether the step drafted at all (``drafting``:
  a drafting forward, the rejection sampler; ``False`` is plain decoding, the no-speculation
  arm). Per arm, a table of buckets of ``rows`` (exact to 16, then four per doubling) holds
  (rows, a low quantile of seconds); predictions interpolate between measured buckets and
  extrapolate with the last measured slope, so a curve that is flat and then steep (bf16 on
  AVX512 CPUs: 9 rows cost ~1 row) is followed, not averaged away. A method whose drafter runs
  more forwards for deeper chains (``specdiff``: ceil(T d / gamma)) tells each drafting step's
  ``stage`` (the drafter forwards it ran); each stage is an arm of its own, and a stage not
  measured yet is predicted from the nearest measured one plus the measured cost of a drafter
  forward.
"""

from __future__ import annotations

from typing import Callable

from .budget_buckets import YOUNG_SAMPLES, Bucket, bucket_of, observe_bucket
from .budget_curves import interpolate, monotone, price_table, secant


# a drafting step of one draft a request priced at this many plain steps or more cannot beat
# plain decoding even if every draft is accepted: drafting has a fixed price (``specdiff``'s
# drafter forward: 11.6 ms against 5.0 ms plain at batch 1, at one draft as at four)
FIXED_PRICE = 2.0


def fixed_price(price: float) -> bool:
    """Whether a drafting step of one draft a request that costs ``price`` plain steps has a
    fixed price: at :data:`FIXED_PRICE` or more, even every draft accepted cannot beat plain
    decoding, so the step's cost is the drafter's, not its rows' (the curve past a lone
    bucket, :func:`_tail_slope`; the priced probe, ``budget_probes.priced_probe``; a lone
    request's kept choice, ``BudgetController``)."""
    return price >= FIXED_PRICE


class StepCost:
    """Measured step time against verified rows, one table per arm (drafting or plain).

    A step can only be slowed, never sped up, by what else happens on the machine (another
    process, the first step of a new shape building its kernels), so each bucket tracks a
    low quantile of its samples: it falls fast towards a faster sample (``down``) and rises
    slowly towards a slower one (``up``), which still follows a real change of cost (a longer
    context, more load) within a few dozen steps. Each bucket also keeps the running mean of
    its samples, ``typical``: what time really passes there (the loss guard's baseline, which
    charges a drafting step what it took: against a low quantile of plain steps a drafting
    step as fast as a typical plain one would be booked as a loss)."""

    def __init__(self, down: float = 0.5, up: float = 0.05) -> None:
        self.down, self.up = down, up
        # arm -> buckets; arm 0 (== False) plain, arm s >= 1 drafting with s drafter forwards
        # (arm 1 == True: every method whose drafting cost does not depend on depth)
        self.tables: dict[int, dict[int, Bucket]] = {False: {}, True: {}}
        # derived, until a sample changes them: predict's curves (any sample: the drafting
        # arms' curves hold plain points) and each arm's points (a sample of that arm)
        self._curves: dict[int, list[tuple[float, float]]] = {}
        self._points: dict[int, list[tuple[float, float]]] = {}

    def observe(self, rows: int, drafting: bool, seconds: float, step: int,
                stage: int = 1) -> None:
        arm = _arm(drafting, stage)
        self._curves.clear()
        self._points.pop(arm, None)
        observe_bucket(self.tables.setdefault(arm, {}), rows, seconds, step, self.down, self.up)

    def points(self, drafting: bool, stage: int = 1) -> list[tuple[float, float]]:
        """(rows, seconds) of the measured buckets, by rows; seconds made non-decreasing.

        A young bucket (fewer than ``YOUNG_SAMPLES`` samples) is priced at no more than the
        curve of the mature ones predicts there: a lone slow step (another process, a first
        shape) would otherwise price its row count, and every count beyond it through the
        last slope, out of reach for good, since nothing is measured where nothing is chosen.
        Optimism costs at most a few steps: those steps are measured, and a bucket that is
        slow three times over is mature and stands. Before a drafting arm has two mature
        buckets, its young ones are priced at no more than the plain curve plus the least
        overhead over it a mature one showed (none mature: a plain step of the same rows;
        the plain curve needs two points, else its flat line would price rows as free).
        A young bucket's own overhead does not count: one slow first drafting step (6 rows,
        19.5 ms against 5.5 ms at 4; another engine, the warm-up's only drafting step, 4 rows,
        14.6 ms against 5.6 ms plain at 2) priced every count beyond it through its slope,
        the trust region and the books allowed no row, no probe ever ran, and engines ran
        1,000 steps without a draft (issue 22)."""
        arm = _arm(drafting, stage)
        pts = self._points.get(arm)
        if pts is None:
            plain = self.points(False) if arm else None
            pts = self._points[arm] = self._measured_points(self.tables.get(arm, {}), plain)
        return pts

    @staticmethod
    def _measured_points(table: dict[int, Bucket],
                         plain: list[tuple[float, float]] | None = None
                         ) -> list[tuple[float, float]]:
        mature = monotone(sorted((m.rows, m.seconds) for m in table.values()
                                  if m.samples >= YOUNG_SAMPLES))
        if len(mature) < 2:
            if plain and len(plain) >= 2 and table:
                over = max(0.0, min((m.seconds - interpolate(plain, m.rows)
                                     for m in table.values() if m.samples >= YOUNG_SAMPLES),
                                    default=0.0))
                return monotone(sorted(
                    (m.rows, m.seconds if m.samples >= YOUNG_SAMPLES else
                     min(m.seconds, interpolate(plain, m.rows) + over))
                    for m in table.values()))
            return monotone(sorted((m.rows, m.seconds) for m in table.values()))
        return monotone(sorted(
            (m.rows, m.seconds if m.samples >= YOUNG_SAMPLES
             else min(m.seconds, interpolate(mature, m.rows))) for m in table.values()))

    def _at(self, rows: int, drafting: bool) -> list[Bucket]:
        """This row count's bucket in every stage of the arm (plain: one)."""
        b = bucket_of(rows)
        return [t[b] for a, t in self.tables.items() if (a > 0) == bool(drafting) and b in t]

    def last_seen(self, rows: int, drafting: bool) -> int | None:
        """The last step this row count was measured in this arm, any stage."""
        return max((m.step for m in self._at(rows, drafting)), default=None)

    def typical(self, rows: int) -> float | None:
        """The running mean of plain steps at this row count's bucket; None until it is
        mature (``YOUNG_SAMPLES``)."""
        mean = self.tables[False].get(bucket_of(rows))
        return mean.typical if mean is not None and mean.samples >= YOUNG_SAMPLES else None

    def baseline(self, rows: int, spread: float = 1.0) -> float | None:
        """The loss guard's plain baseline at this row count: its own :meth:`typical` once
        mature; else, between the nearest mature plain buckets on both sides, the line through
        their typicals, where the larger costs at most ``spread`` more than the smaller. None:
        no such pair. A closed batch's tail meets a new batch size every few steps, and a book
        waits for its baseline (drafting is not allowed before): from the smaller neighbour
        alone, within 10% of the larger, the tail of a batch-16 ``jacobi`` pass still ran 3-7
        plain steps at each new size down to 12, a sixth of its tail steps (issue 22). A plain
        step's cost rises with the batch, so the line between two measured sizes is within
        their difference of the truth (below it where the cost bends down, which charges a
        drafting step more, not less). A bound from one side only is not taken: against
        batch 2's plain steps a batch-16 book went into debt on drafting steps that paid, and
        the engine ran plain."""
        own = self.typical(rows)
        if own is not None:
            return own
        mature = [m for m in self.tables[False].values() if m.samples >= YOUNG_SAMPLES]
        below = max((m for m in mature if m.rows < rows), key=lambda m: m.rows, default=None)
        above = min((m for m in mature if m.rows > rows), key=lambda m: m.rows, default=None)
        if below is None or above is None or above.typical > below.typical * (1 + spread):
            return None
        return interpolate([(below.rows, below.typical), (above.rows, above.typical)],
                           float(rows))

    def samples(self, rows: int, drafting: bool) -> int:
        """Steps measured at this row count in this arm, all stages together."""
        return sum(m.samples for m in self._at(rows, drafting))

    def measured(self, rows: int, drafting: bool, stage: int = 1) -> float | None:
        """This row count's own bucket's price (its low quantile) once it is mature; None
        before (a cheap look-up: no curve is built)."""
        mean = self.tables.get(_arm(drafting, stage), {}).get(bucket_of(rows))
        return mean.seconds if mean is not None and mean.samples >= YOUNG_SAMPLES else None

    def fastest(self, rows: int, drafting: bool, stage: int = 1) -> float | None:
        """This row count's own bucket's price from its first sample on (a young bucket:
        its fastest sample); None before any."""
        mean = self.tables.get(_arm(drafting, stage), {}).get(bucket_of(rows))
        return mean.seconds if mean is not None else None

    def in_plain_steps(self, batch: int, rows: int, stage: int, plain: float | None,
                       young: bool = False) -> float | None:
        """A drafting step of ``batch`` requests and ``rows`` drafts, priced by its own
        bucket (from its first sample where ``young``, else once mature), in steps of
        ``plain`` seconds; None where either is unknown. At :data:`FIXED_PRICE` or more with
        one draft a request, no drafting count is cheap (``budget_probes.priced_probe``) and
        no lone choice to draft is kept (``BudgetController``)."""
        price = (self.fastest if young else self.measured)(batch + rows, True, stage)
        return price / plain if price is not None and plain else None

    def predict(self, rows: int, drafting: bool, stage: int = 1) -> float | None:
        """Seconds of a step with ``rows`` rows; None before any step of either arm. The
        drafting arm's curve starts from the plain steps below its first measured bucket (so
        two steps, one of each, already give a slope); a plain arm with no sample borrows the
        drafting arm's curve; an unmeasured stage, the nearest measured stage's curve shifted
        by the stages between times :meth:`stage_seconds`."""
        pts = self._cached_curve(_arm(drafting, stage))
        return interpolate(pts, float(rows)) if pts else None

    def table(self, drafting: bool, stage: int, upto: int) -> list[float] | None:
        """:meth:`predict` for every row count 0..upto in one walk (the closed-batch drain
        prices dozens of counts a step)."""
        pts = self._cached_curve(_arm(drafting, stage))
        return price_table(pts, upto) if pts else None

    def price_tables(self, upto: int,
                     stage: Callable[[int], int]) -> Callable[[bool, int], list[float] | None]:
        """:meth:`table` by ``(drafting, depth)``, each built once (``stage(depth)``: the
        drafter forwards at that depth; the closed-batch drain reads dozens a decision)."""
        built: dict[tuple[bool, int], list[float] | None] = {}

        def table(drafting: bool, depth: int) -> list[float] | None:
            key = (drafting, stage(depth) if drafting else 0)
            if key not in built:
                built[key] = self.table(drafting, max(1, key[1]), upto)
            return built[key]
        return table

    def _cached_curve(self, arm: int) -> list[tuple[float, float]]:
        """:meth:`_curve`, built once until a sample changes it."""
        pts = self._curves.get(arm)
        if pts is None:
            pts = self._curves[arm] = self._curve(arm)
        return pts

    def _curve(self, arm: int) -> list[tuple[float, float]]:
        plain = self.points(False)
        if arm == 0:
            return plain or self.points(True)
        pts = self.points(True, arm)
        if arm > 1 and not pts:  # a stage never run: borrow the nearest measured one
            near = sorted((abs(a - arm), a) for a, t in self.tables.items() if a > 0 and t)
            if near:
                other = near[0][1]
                shift = (arm - other) * self.stage_seconds()
                pts = monotone([(x, max(0.0, y + shift)) for x, y in self.points(True, other)])
        own = pts
        if arm == 1 and plain:  # plain steps below the drafting range anchor its low end
            low = pts[0][0] if pts else float("inf")
            pts = monotone(sorted(pts + [p for p in plain if p[0] < low]))
        # the point below the last: a plain anchor where the arm has one bucket (_tail_slope)
        slope = _tail_slope(own, plain, pts[-2][1] if len(pts) > 1 else None)
        if pts and slope is not None:  # past the last bucket (_tail_slope)
            x, y = pts[-1]
            pts = pts + [(x + _FAR, y + slope * _FAR)]
        return pts

    def lowest(self, drafting: bool, stage: int = 1) -> float | None:
        """The fewest rows this arm measured (None: none)."""
        pts = self.points(drafting, stage)
        return pts[0][0] if pts else None

    def row_slope(self, stage: int = 1) -> float:
        """A drafting row's cost: the drafting arm's own secant where its buckets span
        ``_SPAN`` rows, else the plain curve's (a row costs what a row costs in either arm,
        ``_tail_slope``); 0 with neither."""
        slope = secant(self.points(True, stage), _SPAN)
        if slope is None:
            slope = secant(self.points(False), 1.0)
        return max(0.0, slope or 0.0)

    def stage_seconds(self) -> float:
        """What one more drafter forward adds to a step: measured between stage 1 and the
        deepest stage run at the same rows; before any deeper stage ran, what drafting at
        all adds to a plain step (an overestimate: it also holds the rejection sampler)."""
        one = self.points(True, 1)
        if not one:
            return 0.0
        deeper = [a for a, t in self.tables.items() if a > 1 and t]
        if deeper:
            arm = max(deeper)
            x, y = self.points(True, arm)[0]
            return max(0.0, (y - interpolate(one, x)) / (arm - 1))
        plain = self.points(False)
        x, y = one[0]
        return max(0.0, y - interpolate(plain, x)) if plain else 0.0

    def slope(self, drafting: bool = True) -> float:
        """Seconds per extra row over the measured range (0 with fewer than two buckets)."""
        pts = self.points(drafting)
        if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
            return 0.0
        return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])


def _arm(drafting: bool, stage: int) -> int:
    return max(1, int(stage)) if drafting else 0


_FAR = 4096.0  # rows: where the tail point sits (past any batch's rows)


def _tail_slope(own: list[tuple[float, float]], plain: list[tuple[float, float]],
                below: float | None = None) -> float | None:
    """Seconds per row past a drafting curve's last bucket: the steeper of its own buckets'
    secant over their upper half (where they span at least ``_SPAN`` rows) and the plain
    curve's; None with neither (then the last segment's slope, as before). A row costs what
    a row costs in either arm; a last segment between two neighbouring buckets is mostly
    their noise: (3 rows, 6.3 ms) and (4 rows, 14.6 ms), each measured three times in a
    warm-up at batch 2, extrapolated at 8.3 ms a row, priced 16 rows at 122 ms, and an
    engine ran 1,000 steps at batch 8 without a draft (issue 22).

    With neither, and one drafting bucket that costs ``FIXED_PRICE`` plain steps or more (the
    plain step below it, ``below``), 0: that bucket extends flat. The last segment is then the
    jump from a plain step to it, the cost of drafting at all (a drafter forward), not of a
    row. ``specdiff``'s one-draft step at batch 1 (11 ms against 5 ms plain) priced each
    further row at 6 ms, four drafts at 29 ms where they cost 12, and no count could pay:
    a fresh engine ran 84% of its steps plain (Zen 4, 0.81 of four drafts fixed; issue 22).
    Optimism costs a step: the trust region (``budget_rows.TrustRegion``) at most doubles
    the rows, and the step measured there gives the arm its own slope. A cheaper jump stays
    a slope: at a fixed batch of two, a draft row priced free went to a request whose drafts
    were seldom accepted (``test_rows_go_to_the_likely_requests``)."""
    slopes = [s for s in (secant(own, _SPAN), secant(plain, 1.0)) if s is not None]
    if slopes:
        return max(slopes)
    fixed = len(own) == 1 and bool(below) and fixed_price(own[0][1] / below)
    return 0.0 if fixed else None


_SPAN = 4.0  # rows a drafting arm's buckets must span before their own slope is trusted
