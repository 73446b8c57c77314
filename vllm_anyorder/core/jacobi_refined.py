"""Which Jacobi drafts the speculation budget should learn acceptance from (engine-free).

A Jacobi iterate improves only at the positions a step verified (pcLLM / Jacobi Forcing,
Sec. 2.1: each verification is one Jacobi iteration of the positions it covers). After k
drafts with m accepted, the next chain's first k - m positions are new iterates; deeper ones
are older guesses that no step refined. Counting every position would teach the budget that
deep positions fail, because a short chain never refines them, and it would then keep the
chain short: a trap that feeds itself. So the budget counts only refined positions: the
acceptance of a position once it has been drafted for, which is what a longer chain would
see. That estimate can be optimistic; the controller's reality check (``core.budget``:
realised tokens per second, drafting against plain) keeps it from costing.

The proposer hands an instance to its budget (``proposers/budget.py``), which calls
:meth:`RefinedPositions.counted` with every step's outcomes.
"""

from __future__ import annotations

# (req_id, drafts verified, drafts accepted)
Outcome = tuple[str, int, int]


class RefinedPositions:
    # an upward probe keeps its depth this many steps: the first refines the new positions,
    # the next judges them (core.budget.BudgetSettings.probe_hold)
    probe_hold = 2

    def __init__(self) -> None:
        self.depth: dict[str, int] = {}  # req_id -> leading refined positions of its chain

    def counted(self, outcomes: list[Outcome]) -> list[Outcome]:
        """Each verified chain cut to the positions its previous verification refined."""
        out = []
        for req_id, k, accepted in outcomes:
            refined = self.depth.get(req_id, 0)
            if k and refined:
                out.append((req_id, min(k, refined), min(accepted, refined)))
            # k drafts verified, m accepted: the next chain's first k - m positions are new
            # iterates; a step without drafts shifts the iterate by one and refines nothing
            self.depth[req_id] = k - accepted if k else max(0, refined - 1)
        return out

    def forget(self, live: set[str]) -> None:
        for req_id in [r for r in self.depth if r not in live]:
            del self.depth[req_id]
