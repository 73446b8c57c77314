"""What changing arm costs: a step whose arm (drafting or plain) differs from the previous
step's is slower than a step of the same rows in a run of its arm (``core/budget.py``).

Measured on vLLM's CPU engine (issue 22, ``assd``, 2-core AMD VM, bf16): at batch 16 a plain
step right after a drafting one took 6.25 ms (median) against 5.01 ms after a plain one, and
a drafting step right after a plain one 9.22 ms against 8.48 ms after a drafting one (batch 8:
5.71 against 4.76 ms, 8.41 against 7.62 ms). Two harms follow, and this module measures what
both need:

* the cost model (``budget_models.StepCost``) prices an arm's steady steps; fed the slow first
  step of every plain spell, the plain price crept up (6.45 against 5.3 ms), a few draft rows
  looked almost free beside it, and closed batches drafted 1-12 rows of 16 at 2.0-2.6 tokens
  per ms against 3.0 plain and 3.5 for a row each. A plain step after a drafting one is
  therefore observed with its measured excess taken off (:meth:`SwitchCost.steady`);
* a plain spell between drafting spells pays both switches: a 4-step plain hold at batch 16
  pays about 2 ms on 20 ms of steps, more than the few per cent the prediction's swings give
  plain. The controller leaves drafting only where plain is predicted to pay that round trip
  (:meth:`SwitchCost.round_trip_share`; the plain side of it, as measured).

Every figure is the engine's own: the excess is the mean amount by which plain steps right
after drafting ones exceeded the cost model's price, less the mean amount by which plain steps
after plain ones did (the price is a low quantile, so they exceed it too); no sample, no
excess.
"""

from __future__ import annotations

MIN_SAMPLES = 3  # plain steps of each kind (switched, steady) before the excess counts
# plain steps a round trip is spread over: twice the shortest plain spell (the controller
# keeps a plain choice 3 more steps, ``BudgetSettings.closed_hold``); longer spells spread
# it further, and a plain spell that long is what leaving drafting must be worth
TRIP_STEPS = 8


class SwitchCost:
    """The extra seconds of a plain step right after a drafting one, measured against the
    cost model's price for its row count; and the arm of the last measured step.

    Only the plain side is measured: a drafting step after plain steps is often a probe or a
    new row count, which the cost model prices worse than the counts it drafts at in a run;
    that bias, not a switch, read as 0.15 ms of excess in a simulation with none
    (``tests/unit/core/test_budget_drain.py``)."""

    def __init__(self, decay: float = 0.1) -> None:
        self.decay = decay
        # plain steps, by whether they switched -> [mean residual seconds, samples]
        self._residual: dict[bool, list[float]] = {}
        self.last: bool | None = None  # the arm of the previous measured step

    def observe(self, drafting: bool, seconds: float, predicted: float | None) -> bool:
        """One measured step (``predicted``: its row count's own price in the cost model
        before it saw this step; None where that is not yet a measured one, a young bucket's:
        an interpolation's error would read as a switch's); whether it switched arm."""
        switched = self.last is not None and self.last != bool(drafting)
        self.last = bool(drafting)
        if not drafting and predicted is not None and predicted > 0:
            r = self._residual.setdefault(switched, [0.0, 0.0])
            r[1] += 1
            r[0] += (seconds - predicted - r[0]) * max(self.decay, 1.0 / r[1])
        return switched

    def excess(self) -> float:
        """Extra seconds of a plain step right after a drafting one (0 until measured)."""
        switched, steady = self._residual.get(True), self._residual.get(False)
        if switched is None or steady is None or switched[1] < MIN_SAMPLES or \
                steady[1] < MIN_SAMPLES:
            return 0.0
        return max(0.0, switched[0] - steady[0])

    def steady(self, drafting: bool, seconds: float, switched: bool) -> float:
        """The seconds the cost model should learn from this step: a plain step after a
        drafting one with its measured excess taken off (never below half its time)."""
        if not switched or drafting:
            return seconds
        return max(seconds - self.excess(), 0.5 * seconds)

    def round_trip_share(self, plain_seconds: float | None) -> float:
        """The round trip of leaving drafting for plain and coming back, as far as measured
        (:meth:`excess`), as a share of the ``TRIP_STEPS`` plain steps (of ``plain_seconds``
        each) it is spread over (0: no plain price yet)."""
        return self.excess() / (TRIP_STEPS * plain_seconds) if plain_seconds else 0.0

    def state(self) -> list:
        return [self.last, sorted((k, [round(v[0], 6), v[1]]) for k, v in self._residual.items())]
