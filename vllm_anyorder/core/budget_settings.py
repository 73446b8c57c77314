"""What the speculation budget is told (``BudgetSettings``, the ``budget`` mode) and what it
says about each step (``Decision``); the controller itself is :mod:`.budget`."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    max_backoff: int = 3  # probes back off to probe_every * 2**max_backoff (budget_probes)
    # drafting runs only while its net loss against plain decoding is within this share of
    # the measured time, over about ``loss_horizon`` steps (budget_guard)
    loss_share: float = 0.01
    loss_horizon: int = 256
    # a closed batch's decision is reused this many more steps while its requests are the
    # same (budget_drain: each decision values a dozen drains)
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
    lost: bool = False  # the realised rates overruled a choice to draft (Realized)
