"""What the speculation budget controller measures of its drafts: acceptance by position, and
the tokens per second its choices really committed.

* :class:`Acceptance` -- per draft position j, P(draft j accepted | drafts < j accepted), engine
  wide (exponentially weighted counts) and per request (its own counts, shrunk towards the
  engine-wide rate with a small prior weight). ``gains(req, n)`` is the expected number of
  accepted drafts each of the first n rows adds: g_j = prod_{m <= j} a_m (non-increasing).
  The engine-wide counts are kept apart for young requests (their first ``young_steps``
  steps in the batch) and the rest: drafts of a request that has just started are accepted
  less (``assd``'s n-gram drafts know only the prompt's bigrams; 0.24-0.35 in a batch's first
  steps against 0.6-0.9 later, issue 22), and pooled, each new batch's first steps dragged the
  rate every request was priced by down for dozens of plain steps, which measure nothing.
* :class:`Realized` -- tokens per second committed by plain and by drafting steps, per batch
  size (the controller's reality check, ``core/budget.py``).
"""

from __future__ import annotations

from typing import Callable

SETTLED, YOUNG = 0, 1  # Acceptance's two age classes


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
        self.decay = decay
        # drafts of one request are accepted in bursts (a loop found, a Jacobi iterate
        # converged): its own counts forget fast, so a burst is drafted for within a step or two
        self.request_decay = request_decay
        self.request_weight = request_weight  # pseudo-trials of the engine rate per request
        self.prior, self.prior_weight = prior, prior_weight
        # engine-wide exponentially forgotten (accepted, tried) per position, for settled
        # (SETTLED) and young (YOUNG) requests
        self.engine = [[[0.0, 0.0] for _ in range(self.n)] for _ in (SETTLED, YOUNG)]
        self.requests: dict[str, list[list[float]]] = {}
        # req_id -> positions with counts (the deepest judged + 1; counts beyond are 0)
        self._judged: dict[str, int] = {}
        self._engine_rates: list[list[float] | None] = [None, None]

    def age_class(self, req_id: str | None) -> int:
        """YOUNG within a request's first ``young_steps`` steps, else SETTLED."""
        if req_id is None:
            return SETTLED
        age = self.age_of(req_id) if self.age_of is not None else 0
        return YOUNG if age <= self.young_steps else SETTLED

    def observe(self, req_id: str, drafted: int, accepted: int) -> None:
        drafted = min(drafted, self.n)
        accepted = min(accepted, drafted)
        if drafted <= 0:
            return
        age = self.age_class(req_id)
        self._engine_rates[YOUNG] = None  # young rates lean on the settled ones
        if age == SETTLED:
            self._engine_rates[SETTLED] = None
        engine = self.engine[age]
        own = self.requests.setdefault(req_id, [[0.0, 0.0] for _ in range(self.n)])
        judged = min(drafted, accepted + 1)  # positions this chain had judged
        if judged > self._judged.get(req_id, 0):
            self._judged[req_id] = judged
        for j in range(drafted):
            if j > accepted:  # never judged: the chain was cut at position accepted + 1
                break
            hit = 1.0 if j < accepted else 0.0
            counts = engine[j]  # exponentially forgotten: the last ~1/decay trials
            counts[0] = counts[0] * (1.0 - self.decay) + hit
            counts[1] = counts[1] * (1.0 - self.decay) + 1.0
            keep = 1.0 - self.request_decay  # a request's own rate follows its recent steps
            own[j][0] = own[j][0] * keep + hit
            own[j][1] = own[j][1] * keep + 1.0

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

    def rate(self, req_id: str | None, position: int) -> float:
        """P(draft at ``position`` (0-based) accepted | earlier ones accepted): the request's
        own (recent) counts, shrunk towards the engine-wide rate with ``request_weight``
        pseudo-trials."""
        j = min(position, self.n - 1)
        engine = self.engine_rates(self.age_class(req_id))[j]
        own = self.requests.get(req_id) if req_id is not None else None
        if own is None:
            return engine
        w = self.request_weight
        return (own[j][0] + w * engine) / (own[j][1] + w)

    def gains(self, req_id: str | None, n: int, floor: float = 0.0) -> list[float]:
        """Expected accepted drafts added by each of the first n rows: g_j = prod_{m<=j} a_m,
        stopping before the first gain below ``floor``."""
        engine, w = self.engine_rates(self.age_class(req_id)), self.request_weight
        own = self.requests.get(req_id) if req_id is not None else None
        last = self.n - 1
        out, run = [], 1.0
        for j in range(n):
            k = j if j < last else last
            a = engine[k] if own is None else (own[k][0] + w * engine[k]) / (own[k][1] + w)
            run *= a
            if run < floor:
                break
            out.append(run)
        return out

    def relax(self, req_id: str) -> None:
        """A step in which the request did not draft: its own counts fade as if a step of
        evidence had passed, so a request that stopped drafting after a bad stretch leans
        back on the engine-wide rate and is tried again a few steps later (its own counts
        only ever change when it drafts)."""
        own = self.requests.get(req_id)
        if own is not None:
            keep = 1.0 - self.request_decay
            for counts in own[:self._judged.get(req_id, 0)]:  # the rest are zeros
                counts[0] *= keep
                counts[1] *= keep

    def forget(self, live: set[str]) -> None:
        for req_id in [r for r in self.requests if r not in live]:
            del self.requests[req_id]
            self._judged.pop(req_id, None)


class Realized:
    """Committed tokens per second the engine really got, per batch size and arm (drafting
    or plain), exponentially forgotten: the check on the models' prediction. A model that
    over-predicts drafting is overruled by what its choices actually gave (not where drafts
    are cold after plain steps, Jacobi iterates: ``BudgetController._drafting_lost``). The
    controller feeds it the drafting steps
    it chose (not its probes: a probe's one-off chain shows what a chain gives when it was
    never drafted for before) and every plain step."""

    def __init__(self, decay: float = 0.05, min_drafting: float = 6.0,
                 min_plain: float = 2.0) -> None:
        self.decay = decay
        # steps before a figure counts: about 7 drafting steps (a chain drafted afresh
        # needs a few to settle), 2 plain ones (a plain step is what it is; they are rare)
        self.min_weight = {True: min_drafting, False: min_plain}
        # (batch, drafting) -> [tokens, seconds, weight, step of the last observation]
        self.table: dict[tuple[int, bool], list[float]] = {}

    def observe(self, batch: int, drafting: bool, tokens: int, seconds: float,
                step: int, restart_after: int | None = None) -> None:
        """One step; a figure last observed more than ``restart_after`` steps ago starts
        afresh (the retry :meth:`rate` allows then is judged on its own steps, not drowned
        in the stale figure that stopped drafting)."""
        t = self.table.get((batch, bool(drafting)))
        if t is None or (restart_after is not None and step - t[3] > restart_after):
            t = self.table[(batch, bool(drafting))] = [0.0, 0.0, 0.0, 0.0]
        keep = 1.0 - self.decay
        t[0], t[1], t[2] = t[0] * keep + tokens, t[1] * keep + seconds, t[2] * keep + 1.0
        t[3] = step

    def rate(self, batch: int, drafting: bool, now: int, max_age: int) -> float | None:
        """Tokens per second of this arm at this batch size; None until enough steps, or
        when the last one is more than ``max_age`` steps old (then the prediction is tried
        again for real)."""
        t = self.table.get((batch, bool(drafting)))
        if t is None or t[2] < self.min_weight[bool(drafting)] or t[1] <= 0 or \
                now - t[3] > max_age:
            return None
        return t[0] / t[1]
