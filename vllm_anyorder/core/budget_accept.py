"""What the speculation budget controller measures of its drafts: acceptance by position
(what its choices really committed: ``core/budget_reality``).

* :class:`Acceptance` -- per draft position j, P(draft j accepted | drafts < j accepted), engine
  wide (exponentially weighted counts) and per request (its own counts, shrunk towards the
  engine-wide rate with a small prior weight). ``gains(req, n)`` is the expected number of
  accepted drafts each of the first n rows adds: g_j = prod_{m <= j} a_m (non-increasing).
  The engine-wide counts are kept apart for young requests (their first ``young_steps``
  steps in the batch) and the rest: drafts of a request that has just started are accepted
  less (``assd``'s n-gram drafts know only the prompt's bigrams; 0.24-0.35 in a batch's first
  steps against 0.6-0.9 later, issue 22), and pooled, each new batch's first steps dragged the
  rate every request was priced by down for dozens of plain steps, which measure nothing.
* Counts are also kept by what the request's previous verified chain did (``AFTER_MISS``:
  its first draft rejected; ``AFTER_PART``: some kept; ``AFTER_WHOLE``: all kept): drafts come
  in bursts (a loop found, an iterate converged), and a chain right after a miss is accepted
  far less deep than one after a hit (``jacobi`` on the tiny target, 16-draft chains,
  P(draft j accepted): after a miss 0.34, 0.15, 0.10, 0.06, 0.04; after a partial hit 0.65,
  0.57, 0.28, 0.19, 0.18; after a whole chain 1.00, 0.93, 0.87 and on; issue 22). A request
  in a class is priced by its own counts of that class, shrunk towards the engine-wide rate of
  chains that followed one of that class (which leans on the class-less rate where seldom
  tried). The class comes from the whole chain as verified (``chain_done``: ``observe`` sees
  only what a method's rule counts); a step without drafts forgets it. The price of pooling:
  right after a likely request's rare miss it is priced near the rate of the unlikely ones'
  misses for a step (``test_budget_bursts``).
"""

from __future__ import annotations

from typing import Callable

SETTLED, YOUNG = 0, 1  # Acceptance's two age classes
# what a request's previous verified chain did (AFTER_NONE: not known, or a plain step since)
AFTER_NONE, AFTER_MISS, AFTER_PART, AFTER_WHOLE = 0, 1, 2, 3


def after_class(drafted: int, accepted: int) -> int:
    """The class a chain of ``drafted`` drafts, ``accepted`` of them kept, leaves its request
    in (``drafted`` > 0)."""
    if accepted <= 0:
        return AFTER_MISS
    return AFTER_WHOLE if accepted >= drafted else AFTER_PART


class Acceptance:
    """Conditional acceptance by draft position, engine-wide and per request.

    An observation is one verified chain: ``drafted`` drafts, the first ``accepted`` kept.
    Position j (1-based) was tried iff j <= drafted, and accepted iff j <= accepted (the rule
    stops at the first rejection, so later drafts were never judged)."""

    def __init__(self, max_positions: int, prior: float = 0.5, prior_weight: float = 2.0,
                 decay: float = 0.02, request_weight: float = 2.0,
                 request_decay: float = 0.25, young_steps: int = 8,
                 age_of: Callable[[str], int] | None = None) -> None:
        self.n = max(1, max_positions)
        self.young_steps = young_steps
        # a request's steps in the batch so far (the controller hands its BatchWatch's);
        # None: every request counts as new
        self.age_of = age_of
        # the same count for a whole batch at once, where the caller has it (the controller
        # hands its BatchWatch's ``young``); None: from ``age_of`` request by request
        self.young_of: Callable[[list[str], int], int] | None = None
        self.decay = decay
        # drafts of one request are accepted in bursts (a loop found, a Jacobi iterate
        # converged): its own counts forget fast, so a burst is drafted for within a step or two
        self.request_decay = request_decay
        self.request_weight = request_weight  # pseudo-trials of the engine rate per request
        self.prior, self.prior_weight = prior, prior_weight
        # engine-wide exponentially forgotten (accepted, tried) per position, for settled
        # (SETTLED) and young (YOUNG) requests
        self.engine = [[[0.0, 0.0] for _ in range(self.n)] for _ in (SETTLED, YOUNG)]
        # the same counts by the class of the chain before (index class - 1), per age class
        self.engine_after = [[[[0.0, 0.0] for _ in range(self.n)] for _ in range(3)]
                             for _ in (SETTLED, YOUNG)]
        self.requests: dict[str, list[list[float]]] = {}
        # req_id -> the class of its last verified chain (absent: AFTER_NONE)
        self.after: dict[str, int] = {}
        # req_id -> its own counts by the class of the chain before (index class - 1), made
        # when first needed
        self.chained: dict[str, list[list[list[float]]]] = {}
        # req_id -> positions with counts (the deepest judged + 1; counts beyond are 0)
        self._judged: dict[str, int] = {}
        self._engine_rates: list[list[float] | None] = [None, None]
        self._after_rates: dict[tuple[int, int], list[float]] = {}  # (age, class) -> rates

    def age_class(self, req_id: str | None) -> int:
        """YOUNG within a request's first ``young_steps`` steps, else SETTLED."""
        if req_id is None:
            return SETTLED
        age = self.age_of(req_id) if self.age_of is not None else 0
        return YOUNG if age <= self.young_steps else SETTLED

    def observe(self, req_id: str, drafted: int, accepted: int,
                age: int | None = None) -> None:
        """``age``: the request's age class when the chain was verified (a record held back
        and applied later, ``BudgetController.held``); None: now."""
        drafted = min(drafted, self.n)
        accepted = min(accepted, drafted)
        if drafted <= 0:
            return
        if age is None:
            age = self.age_class(req_id)
        self._engine_rates[YOUNG] = None  # young rates lean on the settled ones
        if self._after_rates:
            self._after_rates.clear()  # (a class's rates lean on its age class's)
        if age == SETTLED:
            self._engine_rates[SETTLED] = None
        engine = self.engine[age]
        own = self.requests.get(req_id)
        if own is None:
            own = self.requests[req_id] = [[0.0, 0.0] for _ in range(self.n)]
        before = self.after.get(req_id, AFTER_NONE)  # (``chain_done`` moves it)
        after = pooled = None
        if before:
            pooled = self.engine_after[age][before - 1]
            chained = self.chained.get(req_id)
            if chained is None:
                chained = self.chained[req_id] = [[[0.0, 0.0] for _ in range(self.n)]
                                                  for _ in range(3)]
            after = chained[before - 1]
        judged = min(drafted, accepted + 1)  # positions this chain had judged (the rule stops
        if judged > self._judged.get(req_id, 0):  # at the first rejection: later ones never)
            self._judged[req_id] = judged
        fade = 1.0 - self.decay  # engine-wide: exponentially forgotten, the last ~1/decay trials
        keep = 1.0 - self.request_decay  # a request's own rate follows its recent steps
        for j in range(judged):
            hit = 1.0 if j < accepted else 0.0
            counts, mine = engine[j], own[j]
            counts[0] = counts[0] * fade + hit
            counts[1] = counts[1] * fade + 1.0
            if pooled is not None:
                counts = pooled[j]
                counts[0] = counts[0] * fade + hit
                counts[1] = counts[1] * fade + 1.0
            mine[0] = mine[0] * keep + hit
            mine[1] = mine[1] * keep + 1.0
            if after is not None:
                mine = after[j]
                mine[0] = mine[0] * keep + hit
                mine[1] = mine[1] * keep + 1.0

    def chain_done(self, req_id: str, drafted: int, accepted: int) -> None:
        """The request's verified chain, whole and counted or not (``observe`` sees only
        what the method's rule counts): the class its next chain is priced in."""
        if drafted > 0:
            self.after[req_id] = after_class(drafted, accepted)

    def engine_rates(self, age: int = SETTLED) -> list[float]:
        """Engine-wide rate per position; a position seldom tried leans on the one before it
        (the first on the prior): (hits_j + w a_{j-1}) / (tries_j + w). Young requests' rates
        lean position by position on the settled ones (where young drafts were seldom
        tried, young requests are priced as the rest)."""
        rates = self._engine_rates[age]
        if rates is None:
            base = self.engine_rates(SETTLED) if age == YOUNG else None
            rates, before, w = [], self.prior, self.prior_weight
            for j, (hits, tries) in enumerate(self.engine[age]):
                lean = base[j] if base is not None else before
                before = (hits + w * lean) / (tries + w)
                rates.append(before)
            self._engine_rates[age] = rates
        return rates

    def after_rates(self, age: int, after: int) -> list[float]:
        """:meth:`engine_rates` of the chains that followed one of class ``after``, leaning
        position by position on the age class's rates where that class was seldom tried."""
        rates = self._after_rates.get((age, after))
        if rates is None:
            base, w = self.engine_rates(age), self.prior_weight
            rates = self._after_rates[(age, after)] = [
                (hits + w * lean) / (tries + w)
                for (hits, tries), lean in zip(self.engine_after[age][after - 1], base)]
        return rates

    def _class_of(self, req_id: str | None, own: list[list[float]] | None
                  ) -> tuple[list[float], list[list[float]] | None]:
        """The rates ``req_id`` leans on and the own counts it is priced by: with a class,
        the engine-wide rates and its own counts of that class (its counts without one
        mix the chains after misses with those after hits)."""
        age = self.age_class(req_id)
        before = self.after.get(req_id) if own is not None else None
        if before:
            chained = self.chained.get(req_id)
            return self.after_rates(age, before), chained[before - 1] if chained else None
        return self.engine_rates(age), own

    def rate(self, req_id: str | None, position: int) -> float:
        """P(draft at ``position`` (0-based) accepted | earlier ones accepted): the request's
        own (recent) counts, shrunk towards the engine-wide rate with ``request_weight``
        pseudo-trials."""
        j = min(position, self.n - 1)
        own = self.requests.get(req_id) if req_id is not None else None
        rates, own = self._class_of(req_id, own)
        if own is None:
            return rates[j]
        w = self.request_weight
        return (own[j][0] + w * rates[j]) / (own[j][1] + w)

    def gains(self, req_id: str | None, n: int, floor: float = 0.0,
              personal: bool = True) -> list[float]:
        """Expected accepted drafts added by each of the first n rows: g_j = prod_{m<=j} a_m,
        stopping before the first gain below ``floor``. ``personal=False``: the engine-wide
        rates of the request's age class, without its own counts: a forecast over the rest of
        its life rather than its next step, for the closed-batch drain (``core/budget.py``).
        A request's own counts follow its last ~4 steps (bursts: a loop found, a chain
        converged); priced by them, a drain gave requests in a loop (priced 0.96-1.00,
        accepting 0.81 a draft) one draft and those that had just missed two, and ``jacobi``
        at batch 16 drafted 37-44 rows where two each (48) paid: ``cycle:2`` / ``auto`` 1.11
        against 1.06 with class rates, medians of six runs (issue 22)."""
        own = self.requests.get(req_id) if req_id is not None and personal else None
        engine, own = self._class_of(req_id, own)
        w = self.request_weight
        last = self.n - 1
        out, run = [], 1.0
        for j in range(n):
            k = j if j < last else last
            if own is None:
                run *= engine[k]
            else:
                hits, tries = own[k]
                run *= (hits + w * engine[k]) / (tries + w)
            if run < floor:
                break
            out.append(run)
        return out

    def young(self, req_ids: list[str]) -> int:
        """How many of these requests are in their first ``young_steps`` steps."""
        if self.young_of is not None:
            return self.young_of(req_ids, self.young_steps)
        return sum(1 for r in req_ids if self.age_class(r) == YOUNG)

    def relax(self, req_id: str, steps: int = 1) -> None:
        """A step in which the request did not draft: its own counts fade as if a step of
        evidence had passed, so a request that stopped drafting after a bad stretch leans
        back on the engine-wide rate and is tried again a few steps later (its own counts
        only ever change when it drafts). ``steps``: that many such steps, each count faded
        once per step (the same floats as one call per step)."""
        if self.after:
            self.after.pop(req_id, None)  # its next chain starts anew
        own = self.requests.get(req_id)
        if own is not None:
            keep = 1.0 - self.request_decay
            for counts in own[:self._judged.get(req_id, 0)]:  # the rest are zeros
                hits, tries = counts
                for _ in range(steps):
                    hits *= keep
                    tries *= keep
                counts[0], counts[1] = hits, tries

    def relax_plain(self, req_ids: list[str], caps: list[int]) -> None:
        """:meth:`relax` every request of a step that gave it no drafts."""
        own, after = self.requests, self.after
        if own or after:  # (a class may stand without counts: ``forget``)
            for req_id, cap in zip(req_ids, caps):
                if not cap and (req_id in own or req_id in after):
                    self.relax(req_id)

    def relax_steps(self, req_ids: list[str], steps: int) -> None:
        """:meth:`relax_plain` of ``steps`` steps in which none of ``req_ids`` drafted."""
        for req_id in req_ids:
            self.relax(req_id, steps)

    def forget(self, live: set[str]) -> None:
        for req_id in [r for r in self.requests if r not in live]:
            del self.requests[req_id]
            self._judged.pop(req_id, None)
            self.chained.pop(req_id, None)
        # (a chain its method's rule never counted leaves a class and no counts)
        for req_id in [r for r in self.after if r not in live]:
            del self.after[req_id]
