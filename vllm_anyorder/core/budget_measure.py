"""What one measured engine step updates in the speculation budget controller
(``core/budget.py``): the step-cost model, what changing arm costs, the trust region, the
drafting prices per batch size, the realised rates and the books. ``BudgetController.
record_step`` calls it at once for a drafting step and, for a plain one under a decision to
draft nothing, when the backlog is replayed (``budget_backlog``), with the decision count the
step ran under."""

from __future__ import annotations

# plain steps this close after a drafting step run slower than plain steps further on
# (traces of ``jacobi`` at T=0.8, concurrency 8, 2-core Xeon, 11 servers: +0.6-3.7 ms the
# first, +0.0-1.9 ms the next four, then nothing; where drafting ran 11-22% of the steps, the
# plain steps' median rose 9-13%): drafting's cost, booked to it (budget_guard; issue 22)
AFTER_DRAFTING = 5
# a step over this many times its row count's measured price stalled (the VM, the OS, a
# collector) and counts as that: one drafting step of 614 ms among 5-6 ms steps charged the
# books half their horizon, and the batch ran 630 steps plain at 0.79 of cycle:4 (issue 22)
STALL = 4.0


def measure(c, rows: int, drafting: bool, seconds: float, batch: int, tokens: int,
            depth: int, decision: int) -> None:
    """Controller ``c`` learns from one step of ``rows`` rows that took ``seconds``
    (``tokens`` committed over ``batch`` requests; ``depth``: its deepest chain;
    ``decision``: the controller's decision count when it ran)."""
    stage = c.search.stage(depth)
    usual = c.cost.measured(rows, drafting, stage)  # its bucket's price, if mature
    if usual is not None and seconds > STALL * usual:
        seconds = STALL * usual
        c.totals["stalls"] += 1
    # a row count's first drafting step builds its kernels (16-33 ms against 6-9 ms after,
    # issue 22): charged what the model predicted (else one such step kept a fresh server's
    # batch plain for hundreds of steps)
    charged = seconds
    if drafting and rows not in c._shapes:
        c._shapes.add(rows)
        predicted = c.cost.predict(rows, True, stage)
        charged = min(seconds, predicted) if predicted else seconds
    # the cost model learns an arm's steady price: a step that changed arm, with
    # what changing arm costs taken off (budget_switch; priced by its own bucket)
    switched = c.switch.observe(drafting, seconds, usual)
    c.cost.observe(rows, drafting, c.switch.steady(drafting, seconds, switched), decision,
                   stage)
    if drafting:
        c.trust.observe(batch or c.last.batch, rows)
        if batch:
            c.prices.observe(batch, rows, seconds, stage)
    c.reality.observe(batch, drafting, c.last.probe, tokens, seconds, decision)
    # measured steps since the last drafting one (None: more than AFTER_DRAFTING)
    after = c.after_drafting
    if drafting:
        c.after_drafting = 0
    elif after is not None:
        c.after_drafting = after + 1 if after < AFTER_DRAFTING else None
    if batch and tokens:  # the guard's baseline: plain steps measured at this batch,
        # their mean (drafting steps are charged what they took, not a low quantile); a
        # plain step right after drafting is charged as drafting is (AFTER_DRAFTING)
        booked = drafting or c.after_drafting is not None
        c.guard.observe(booked, charged, tokens, batch, c.cost.baseline(batch))
