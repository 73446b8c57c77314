"""What the speculation budget is told (``BudgetSettings``, the ``budget`` mode) and what it
says about each step (``Decision``); the controller itself is :mod:`.budget`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple

MODES = ("auto", "fixed")
CYCLE_PREFIX = "cycle:"


def parse_mode(mode: str) -> tuple[str, tuple[int, ...]]:
    """("auto" | "fixed" | "cycle", caps); ValueError for anything else."""
    if mode in MODES:
        return mode, ()
    if isinstance(mode, str) and mode.startswith(CYCLE_PREFIX):
        caps = tuple(int(x) for x in mode[len(CYCLE_PREFIX):].split(",") if x.strip())
        if caps and all(c >= 0 for c in caps):
            return "cycle", caps
    raise ValueError(f"budget must be one of {list(MODES)} or 'cycle:<n>,<n>,...', got {mode!r}")


@dataclass(frozen=True)
class BudgetSettings:
    mode: str = "auto"
    max_drafts: int = 16  # per request (the method's configured size)
    warmup_steps: int = 24  # measured steps during which every other step probes
    probe_every: int = 32  # afterwards, one probe per this many measured steps
    hysteresis: float = 0.05  # a new choice must predict this much more goodput
    # drafting must predict this much more goodput than plain decoding: near break-even the
    # prediction's error decides, and a wrong "draft" costs while a wrong "plain" only forgoes
    margin: float = 0.03
    stale_after: int = 100  # a probe re-measures a row count only this many steps later
    # steps an upward probe keeps its row count (> 1 for drafts that improve only where they
    # are verified, Jacobi iterates: the first step at a new depth refines, the next judge)
    probe_hold: int = 1
    # drafts cold everywhere after plain steps (Jacobi iterates, refined only where verified):
    # a far probe from plain decoding takes the nearest stale count, not two drafts each
    cold_after_plain: bool = False
    max_backoff: int = 3  # probes back off to probe_every * 2**max_backoff (budget_probes)
    # drafting runs only while its net loss against plain decoding is within this share of
    # the measured time, over about ``loss_horizon`` steps (budget_guard)
    loss_share: float = 0.01
    loss_horizon: int = 256
    # a decision (a closed batch's, or one to draft nothing) is reused this many more steps
    # while the batch's requests are the same, up to 15 while it repeats (KeptDecision)
    closed_hold: int = 3


@dataclass
class Decision:
    """What the controller chose for one step and why (logs, metrics, tests)."""

    rows: int = 0  # draft rows allotted over the batch
    batch: int = 0
    probe: bool = False
    goodput: float = 0.0  # predicted tokens / s of the choice (0 when unknown)
    plain_goodput: float = 0.0  # predicted tokens / s with no drafts
    caps: list[int] = field(default_factory=list)
    guarded: bool = False  # the loss guard allowed no drafting in this step
    closed: bool = False  # valued by the time to finish a closed batch (budget_drain)
    lost: bool = False  # the realised rates overruled a choice to draft (budget_reality)


class _Kept(NamedTuple):
    """A kept decision (:class:`KeptDecision`) and what it was kept for."""

    req_ids: list[str]  # the batch, in row order
    caps: list[int]
    closed: bool  # the batch was closed when it was kept
    young: int  # requests in their young steps when it was kept
    plain: bool  # the caps draft nothing


class KeptDecision:
    """The last decision, used again ``hold`` more steps instead of deciding afresh (longer
    while deciding afresh keeps giving the same caps: :meth:`keep`): a closed
    batch's (each decision there values a dozen drains: ~0.3 ms of a ~8 ms step, issue 22), a
    choice to draft nothing in any batch (while nothing is drafted the acceptance does not
    move, and deciding afresh cost 90-130 us of a 5-9 ms step at T = 0.8, where drafting does
    not pay), and a lone request's choice to draft once it repeats, ``hold`` steps (its own
    acceptance moves from step to step; deciding afresh every step cost ~150 us of a ~3 ms
    step in the engine; ``assd`` at batch 1 went from 0.92-0.95 to 0.94-0.96 of its best
    fixed size, ``jacobi`` from 0.94-0.99 to 0.96-1.07, 2-core Xeon, issue 22)."""

    def __init__(self, hold: int, longest: int = 15) -> None:
        self.hold, self.longest = hold, longest
        self._kept: _Kept | None = None
        self._left = 0  # steps the kept decision may still be used
        self._last: tuple[list[str], list[int], bool] | None = None  # the last one kept
        self._repeats = 0  # fresh decisions in a row that came out as the last one kept

    def reuse(self, req_ids: list[str], limits: list[int], closed: bool,
              may: Callable[[bool], bool], young: int = 0) -> list[int] | None:
        """The kept decision's caps again (within each request's limit) while the batch is
        unchanged, as closed as it was, with as many ``young`` requests (a request's first
        steps are priced by young requests' rates, ``budget_accept``: a closed batch's plain
        choice of its first steps, kept up to 15 steps, ran on past them, 50% of its steps
        9-16 plain where two drafts each paid 1.3x, issue 22) and ``may(plain)`` (the
        controller's books and probes allow it; ``plain``: the kept caps draft nothing);
        None: decide afresh (and nothing is kept any more)."""
        kept, self._kept = self._kept, None
        if kept is None or kept.closed != closed or kept.young != young or \
                self._left <= 0 or kept.req_ids != req_ids or not may(kept.plain):
            return None
        self._kept = kept
        self._left -= 1
        if kept.plain:  # (limits are >= 0: nothing to cut)
            return [0] * len(limits)
        return [min(c, lim) for c, lim in zip(kept.caps, limits)]

    def keep(self, req_ids: list[str], caps: list[int], closed: bool = True,
             young: int = 0, grow: bool = True) -> None:
        """Keep a fresh decision: ``hold`` steps, doubled (+1) each time deciding afresh gave
        the same caps for the same batch again, up to ``longest`` (a closed batch drafting
        16 each decided the same ~30 times in a row, each decision ~0.3 ms, issue 22);
        ``grow=False``: ``hold`` steps once it repeats the last one kept; a first choice is
        decided afresh the next step, so a lone request's early choices, made on prices not
        yet measured, are not run three steps each (issue 22)."""
        same = self._last == (req_ids, caps, closed)
        self._repeats = self._repeats + 1 if same else 0
        self._last = (list(req_ids), caps, closed)
        if grow:
            hold = min(self.longest, (self.hold + 1) * 2 ** min(self._repeats, 8) - 1)
        else:
            hold = self.hold if self._repeats else 0
        self._kept = _Kept(list(req_ids), caps, closed, young, not any(caps))
        self._left = hold

    def state(self) -> tuple | None:
        return (self._kept, self._repeats, self._left)
