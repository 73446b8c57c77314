"""What the speculation budget controller learns from each engine step (``core/budget.py``):
the step's time (``budget_measure``), each verified chain (acceptance by position:
``budget_accept``; the prices checked: ``budget_calibration``), and when each record is
applied: at once, or held back where nothing reads it before the next fresh decision
(``budget_backlog``: plain steps under a decision to draft nothing, steps under a kept decision
to draft once reused), replayed in order by :meth:`BudgetRecords.flush` before any read.
"""

from __future__ import annotations

from .budget_backlog import HeldRecords
from .budget_measure import measure


class BudgetRecords:
    """``BudgetController``'s recording half (its state lives in the controller)."""

    def flush(self) -> None:
        """Apply the plain steps' bookkeeping held back (``budget_backlog``): before anything
        reads the cost model, the realised rates, the books or a request's own counts."""
        if self.backlog:
            self.backlog.replay_relax(self.accept.relax_steps)
            for rows, seconds, batch, tokens, decision in self.backlog.take_steps():
                measure(self, rows, False, seconds, batch, tokens, 0, decision)
        if self.held:
            self.held.replay(lambda *step: measure(self, *step), self._verified,
                             lambda req_id, hit: self.calibration.verified(req_id, 1, hit),
                             self.accept.relax_plain, self.accept.chain_done)

    def _holds(self) -> bool:
        """Whether this record is held back (the decision it ran under was a kept one to
        draft, reused); the plain steps' backlog is applied first (order kept)."""
        if self._kept_drafting and self.defer_records:
            if self.backlog:
                self.flush()
            return True
        return False

    # ------------------------------------------------------------------ measurements
    def record_step(self, rows: int, drafting: bool, seconds: float, batch: int = 0,
                    tokens: int = 0, depth: int = 0) -> None:
        """One engine step's wall time (only steps the batch ran unchanged: no prefill);
        ``tokens`` it committed over ``batch`` requests, where the caller counts them;
        ``depth``: its deepest chain (for ``stages``)."""
        if seconds <= 0:
            return
        self.measured += 1
        if self._holding and not drafting and not self.held:  # replayed when read (flush)
            self.backlog.steps.append((rows, seconds, batch, tokens, self.decisions))
            return
        if self._holds():
            self.held.ops.append((HeldRecords.STEP, rows, drafting, seconds, batch, tokens,
                                  depth, self.decisions))
            return
        self.flush()
        measure(self, rows, drafting, seconds, batch, tokens, depth, self.decisions)

    def record_verified(self, req_id: str, drafted: int, accepted: int) -> None:
        """One request's verification: ``drafted`` drafts, the first ``accepted`` kept."""
        self.totals["drafted"] += drafted
        self.totals["accepted"] += accepted
        if self._holds():  # its age class now: applied later, the request is older then
            self.held.ops.append((HeldRecords.VERIFIED, req_id, drafted, accepted,
                                  self.accept.age_class(req_id)))
            return
        self.flush()
        self._verified(req_id, drafted, accepted)

    def _verified(self, req_id: str, drafted: int, accepted: int,
                  age: int | None = None) -> None:
        self.accept.observe(req_id, drafted, accepted, age)
        self.calibration.verified(req_id, drafted, accepted)

    def record_chain(self, req_id: str, drafted: int, accepted: int) -> None:
        """Every verified chain as it was (after what :meth:`record_verified` counts of it):
        what it did sets the class the request's next chain is priced in
        (``budget_accept``)."""
        if self._holds():
            self.held.ops.append((HeldRecords.CHAIN, req_id, drafted, accepted))
            return
        self.flush()
        self.accept.chain_done(req_id, drafted, accepted)

    def record_head(self, req_id: str, accepted: bool) -> None:
        """A verified chain the method's counting rule leaves out (``jacobi``: its head cold
        after plain steps or stale after a whole chain, or its iterates not warm yet): its
        first draft checks the price all the same (``budget_calibration``, position 1 only;
        the acceptance model learns nothing from it)."""
        if self._holds():
            self.held.ops.append((HeldRecords.HEAD, req_id, int(accepted)))
            return
        self.flush()
        self.calibration.verified(req_id, 1, int(accepted))

    def expected(self, req_id: str, rows: int) -> list[float]:
        """The gains the request's next ``rows`` rows are priced at (a trace's record)."""
        self.flush()
        return self.calibration.apply(self.accept.gains(req_id, rows))

    def forget(self, live: set[str]) -> None:
        self.flush()
        self.accept.forget(live)
        self.calibration.forget(live)
