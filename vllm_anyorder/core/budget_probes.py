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
* the reality check's retry of a losing prediction (``stale_after``) is spaced out by the same
  factor (``spacing``), as it is a probe of its own.

A step with a new batch size judges nothing: its choice differs for reasons of its own.
Everything here is a function of decisions and choices the controller made, so every TP rank,
fed the same measurements, keeps the same schedule.
"""

from __future__ import annotations


class ProbeSchedule:
    def __init__(self, probe_every: int, warmup_steps: int, max_backoff: int) -> None:
        self.probe_every, self.warmup_steps = max(1, probe_every), warmup_steps
        self.max_backoff = max_backoff
        self.backoff = 0  # e: the gap is probe_every * 2**e
        self.last = 0  # decision number of the last probe
        self.pending: tuple[int, int] | None = None  # (batch, choice) when it was taken

    def due(self, decision: int, measured: int) -> bool:
        """A probe in this decision?"""
        if measured < self.warmup_steps:
            return decision % 2 == 0
        return decision - self.last >= self.gap()

    def gap(self) -> int:
        """Steps between probes after warm-up, as things stand."""
        return max(1, round(self.probe_every * 2.0 ** self.backoff))

    def started(self, decision: int, batch: int, choice: int, measured: int) -> None:
        """A probe is taken at ``decision``; the controller's own choice was ``choice``
        (warm-up probes are not judged)."""
        self.last = decision
        self.pending = (batch, choice) if measured >= self.warmup_steps else None

    def judge(self, batch: int, choice: int) -> None:
        """The first settled choice after a probe: moved, the next probe comes soon; still
        plain, the gap doubles; still drafting, the base gap."""
        if self.pending is None:
            return
        before_batch, before = self.pending
        self.pending = None
        if before_batch != batch:
            return
        if (before > 0) != (choice > 0) or abs(choice - before) > max(1, before // 4):
            self.backoff = -2
        elif choice == 0:
            self.backoff = min(self.backoff + 1, self.max_backoff)
        else:
            self.backoff = 0

    def spacing(self) -> int:
        """How many times ``probe_every`` the probes are apart now (at least 1)."""
        return 2 ** max(0, self.backoff)

    def state(self) -> list:
        return [self.backoff, self.last, self.pending]
