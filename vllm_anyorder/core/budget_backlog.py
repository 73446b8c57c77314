"""Plain steps' bookkeeping, held back while the speculation budget keeps drafting nothing
(``core/budget.py``), and done all at once when something reads what it would change.

On a step where no request drafts, the budget's own work is small in instructions but not in
time: the model forward before it has evicted the caches, so each object a step touches costs
a miss, and on 2 CPU cores its ~30 small calls were 2-3% of a step (issue 22; the same code
runs 3-4x faster in a warm loop). Two of them need not run that step: the step-cost model's
update from the plain step's time (``BudgetController.record_step``) and the fading of each
request's own acceptance counts (``Acceptance.relax_plain``): nothing reads either until the
controller decides afresh (a kept decision to draft nothing reads neither) or a record, a log,
a metric or a fingerprint asks. So they are queued here and replayed in order, with the values
they would have read then, before the first such read: the same arithmetic in the same order,
so every decision is the one the step-by-step bookkeeping gives (checked against it on random
histories: ``tests/unit/core/test_budget_backlog.py``).

The same holds under a kept decision to draft (``KeptDecision``; a closed batch's decision is
kept a few steps): once it is reused, nothing reads the steps' records (the step's time, each
chain's outcome, the fading of requests that drafted nothing) before the next fresh decision,
whose books then read them (:class:`HeldRecords`). In the engine those records were ~70 us of
a 3.6 ms step (``jacobi``, batch 4, 2-core Xeon), ~35 us replayed in a warm loop (issue 22).
"""

from __future__ import annotations

from typing import Callable


class PlainBacklog:
    """Plain steps' records and acceptance fades not applied yet."""

    __slots__ = ("steps", "relax_ids", "relax_steps")

    def __init__(self) -> None:
        # (rows, seconds, batch, tokens, the controller's decision count then) per plain step
        self.steps: list[tuple[int, float, int, int, int]] = []
        self.relax_ids: list[str] | None = None  # the batch whose own counts are to fade
        self.relax_steps = 0  # plain steps of that batch not faded yet

    def __bool__(self) -> bool:
        return bool(self.steps) or bool(self.relax_steps)

    def hold_relax(self, req_ids: list[str], fade: Callable[[list[str], int], None]) -> None:
        """One more plain step of ``req_ids`` to fade (``fade(ids, n)``: n steps' fading,
        called first for a different batch's pending steps)."""
        if self.relax_steps and self.relax_ids != req_ids:
            self.replay_relax(fade)
        if not self.relax_steps:
            self.relax_ids = list(req_ids)
        self.relax_steps += 1

    def replay_relax(self, fade: Callable[[list[str], int], None]) -> None:
        if self.relax_steps:
            ids, n = self.relax_ids, self.relax_steps
            self.relax_ids, self.relax_steps = None, 0
            fade(ids, n)

    def take_steps(self) -> list[tuple[int, float, int, int, int]]:
        steps, self.steps = self.steps, []
        return steps


class HeldRecords:
    """Records of steps under a reused kept decision to draft, in order, not applied yet."""

    __slots__ = ("ops",)
    STEP, VERIFIED, HEAD, RELAX, CHAIN = range(5)

    def __init__(self) -> None:
        self.ops: list[tuple] = []

    def __bool__(self) -> bool:
        return bool(self.ops)

    def replay(self, step: Callable[..., None], verified: Callable[..., None],
               head: Callable[[str, int], None], relax: Callable[[list[str], list[int]], None],
               chain: Callable[[str, int, int], None]) -> None:
        """Apply them in order: ``step(rows, drafting, seconds, batch, tokens, depth,
        decision)``, ``verified(req_id, drafted, accepted, age)``, ``head(req_id, accepted)``,
        ``relax(req_ids, caps)``, ``chain(req_id, drafted, accepted)``."""
        ops, self.ops = self.ops, []
        calls = (step, verified, head, relax, chain)
        for op, *args in ops:
            calls[op](*args)
