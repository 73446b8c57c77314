"""Which Jacobi drafts the speculation budget should learn acceptance from (engine-free).

A Jacobi iterate improves only at the positions a step verified (pcLLM / Jacobi Forcing,
Sec. 2.1: each verification is one Jacobi iteration of the positions it covers). After k
drafts with m accepted, the next chain's first k - m positions are new iterates; deeper ones
are older guesses that no step refined. Counting every position would teach the budget that
deep positions fail, because a short chain never refines them, and it would then keep the
chain short: a trap that feeds itself. So the budget counts only refined positions: the
acceptance of a position once it has been drafted for, which is what a longer chain would
see. That estimate can be optimistic; the controller's books (``core.budget_guard``: what
drafting lost against plain decoding, at most 1% of the time) keep it from costing. Its
reality check (realised tokens per second) does not apply here: after plain steps a retry
drafts cold chains, so its figure says how warm they were (``cold_after_plain``).

A chain's head can also be drafted anew each step: with ``recycle="pool_first"`` the pooled
continuation of the last committed token (an n-gram from the committed text or a recycled
tail, ``JacobiState._splice_recycled``) overwrites it. Those positions are not stale either:
their guess is as good in a long chain as in a short one, so they count like refined ones.
Without them, a request in a loop (every chain accepted whole, so nothing left refined)
would never teach the budget that its deep positions hold.

A request's first two drafting steps within its first eight steps count not at all: its
iterates start from nothing (the pool holds only the prompt's n-grams), and they are accepted
a tenth as often as later ones.
Counted, every new batch's requests were priced by them (the young class of
``core.budget_accept``), and each batch's first dozen steps ran plain where fixed chains paid.

The proposer hands an instance to its budget (``proposers/budget.py``), which calls
:meth:`RefinedPositions.counted` with every step's outcomes. A chain left out still checks
its first draft's price (``core/budget_calibration``: position 1, where there is no trap).
"""

from __future__ import annotations

# (req_id, drafts verified, drafts accepted)
Outcome = tuple[str, int, int]


class RefinedPositions:
    # an upward probe keeps its depth this many steps: the first refines the new positions,
    # the next judges them (core.budget_settings.BudgetSettings.probe_hold)
    probe_hold = 2
    cold_after_plain = True  # a plain step refines no position of the chain

    # a request's first drafting steps are not counted: its iterates start from nothing and
    # need two verifications to be refined at all (accepted per draft, batch 16, issue 22:
    # 0.02-0.10 and 0.02-0.18 in a request's first two drafting steps, 0.36-0.60 from its
    # fourth; 0.45-0.51 in the first steps after plain ones, whose chains the pool heads)
    warmup = 2
    # ... but only within a request's first steps, while its pool holds little more than the
    # prompt: a request that first drafts later (a probe from plain decoding) heads its chain
    # with n-grams of its own text, and uncounted, probes that reach each request once or
    # twice in its life taught nothing: a batch-4 engine ran 99% of its steps plain, 6
    # probes in ~3,000 steps and no draft ever counted (0.96x no speculation, 0.65 of
    # ``cycle:4``; issue 22)
    warmup_window = 8

    def __init__(self) -> None:
        self.depth: dict[str, int] = {}  # req_id -> leading refined positions of its chain
        self.fresh: dict[str, int] = {}  # req_id -> leading positions its chain drafted anew
        self.runs: dict[str, int] = {}  # req_id -> drafting steps verified (up to warmup)
        self.age: dict[str, int] = {}  # req_id -> steps seen (up to warmup_window + 1)
        # the batch of the last plain step after which all its requests were settled (age at
        # its cap, nothing refined, nothing drafted anew): another plain step of it changes
        # nothing (None: not known; any other call clears it)
        self._settled: tuple[str, ...] | None = None

    def drafted(self, req_id: str, fresh: int) -> None:
        """The request's next chain leads with ``fresh`` positions drafted anew this step
        (a pooled n-gram spliced over the head); they count like refined ones."""
        self._settled = None
        self.fresh[req_id] = fresh

    def counted(self, outcomes: list[Outcome]) -> list[Outcome]:
        """Each verified chain cut to the positions its previous verification refined or
        its drafter drafted anew (:meth:`drafted`), whichever reaches further."""
        self._settled = None
        out = []
        depth, fresh, ages, runs = self.depth, self.fresh, self.age, self.runs
        oldest = self.warmup_window + 1
        for req_id, k, accepted in outcomes:
            refined = depth.get(req_id, 0)
            anew = fresh.pop(req_id, 0) if fresh else 0
            age = ages[req_id] = min(ages.get(req_id, 0) + 1, oldest)
            if not k:  # a step without drafts shifts the iterate by one and refines nothing
                depth[req_id] = refined - 1 if refined > 0 else 0
                continue
            if runs.get(req_id, 0) < self.warmup and age <= self.warmup_window:
                runs[req_id] = runs.get(req_id, 0) + 1  # not warm yet: not counted
            else:
                judged = max(refined, anew)
                if judged:
                    out.append((req_id, min(k, judged), min(accepted, judged)))
            # k drafts verified, m accepted: the next chain's first k - m positions are new
            # iterates
            depth[req_id] = k - accepted
        return out

    def plain_step(self, req_ids: tuple[str, ...]) -> None:
        """:meth:`counted` of a step in which none of ``req_ids`` drafted (it counts none)."""
        if req_ids == self._settled:
            return  # the usual plain step: every request settled already
        depth, ages, oldest = self.depth, self.age, self.warmup_window + 1
        fresh = self.fresh
        settled = True
        for req_id in req_ids:
            if fresh:
                fresh.pop(req_id, None)
            age = ages[req_id] = min(ages.get(req_id, 0) + 1, oldest)
            refined = depth.get(req_id, 0)
            depth[req_id] = refined - 1 if refined > 0 else 0
            settled = settled and age == oldest and refined <= 1
        self._settled = req_ids if settled else None

    def forget(self, live: set[str]) -> None:
        self._settled = None
        for known in (self.depth, self.fresh, self.runs, self.age):
            for req_id in [r for r in known if r not in live]:
                del known[req_id]
