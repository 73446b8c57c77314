"""The budget controller's adapter: what vLLM's steps tell it, and the caps it hands back.

One instance per proposer (every method). The proposer base class calls, each engine step:

* :meth:`StepBudget.verified` from ``observe_verification`` -- drafts vLLM scheduled per
  request this step (``spec_decode_metadata.num_draft_tokens``);
* :meth:`StepBudget.begin` first thing in ``propose`` -- closes the measurement of the
  previous decision: wall seconds from the previous ``begin`` to now (that decision's
  drafting work + this step's forward over its rows), kept only when the batch ran
  unchanged (no request joined, left or prefilled); and each drafted request's outcome
  (committed tokens - 1 = accepted drafts);
* :meth:`StepBudget.caps` -- drafts per request for the next step (``core.budget``);
* :meth:`StepBudget.end` with the drafts actually returned.

The dLLM proposer (``proposers/dllm.py``) overrides ``propose`` and decides within vLLM's
sampling step, in denoising rounds: it asks :meth:`StepBudget.caps` per round and reports
each round it timed itself with :meth:`StepBudget.round_done` (``begin`` / ``end`` never run
for it, so nothing is counted twice).

Which drafts acceptance is learnt from: all of them, unless the proposer hands a counting
rule (``counting``, a :class:`~vllm_anyorder.contract.BudgetCounting`), e.g. Jacobi's
:class:`~vllm_anyorder.core.jacobi_refined.RefinedPositions` (only positions a verification
refined count).

Tensor parallelism: every rank runs the same controller on the same inputs. Acceptance is the
same on every rank (outputs are); step times are not, so rank 0's measurement is broadcast
over the TP group each step and every rank records that one: identical decisions, and the
controller's digest is part of ``diagnostics`` (the ranks must agree).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from vllm_anyorder.contract import BudgetCounting
from vllm_anyorder.core.budget import BudgetController
from vllm_anyorder.core.budget_settings import BudgetSettings

logger = logging.getLogger("vllm_anyorder")
LOG_INTERVAL_ENV = "VLLM_ANYORDER_BUDGET_LOG_INTERVAL"  # seconds between summaries (0: off)
# a directory: every worker appends one JSON line per step (what it verified, what it kept,
# what the step cost, ``t`` when it was written; flags: guarded, probe, closed, lost) to
# trace-<pid>.jsonl there
# (benchmarks/budget_replay.py replays them)
TRACE_ENV = "VLLM_ANYORDER_BUDGET_TRACE"
SNAPSHOT_BYTES = 256  # the metrics snapshot's fixed size (its JSON is ~100 bytes)


@dataclass
class _Pending:
    """The last decision, until the next step tells what it cost and what it kept."""

    req_ids: tuple[str, ...]
    drafted: dict[str, int]  # req_id -> drafts returned to vLLM
    start: float


class StepBudget:
    def __init__(self, mode: str, max_drafts: int, tp_group: Any = None,
                 snapshot_path: str | None = None, counting: BudgetCounting | None = None,
                 stages: Callable[[int], int] | None = None) -> None:
        self.controller = BudgetController(BudgetSettings(
            mode=mode, max_drafts=max_drafts,
            probe_hold=counting.probe_hold if counting is not None else 1,
            cold_after_plain=counting.cold_after_plain if counting is not None else False),
            stages)
        self.counting = counting  # the proposer's rule for which outcomes count (or None)
        self.tp_group = tp_group  # vLLM's TP GroupCoordinator when world size > 1
        self._pending: _Pending | None = None
        self._scheduled: dict[str, int] = {}
        self._live: tuple[str, ...] = ()  # the batch at the last forget
        # wall seconds spent in ``AnyOrderProposer.propose`` (the budget and the drafting), a
        # benchmark's read-out of the plugin's own work a step (``bench_switch``); this rank's,
        # never part of a decision
        self.propose_seconds = 0.0
        self._log_every = float(os.environ.get(LOG_INTERVAL_ENV, "30"))
        self._logged = time.monotonic()
        # rank 0 leaves its state here once a second for the front-end's metrics
        rank = tp_group.rank_in_group if tp_group is not None else 0
        self._snapshot = snapshot_path if rank == 0 else None
        self._snapshot_at = 0.0
        self._snapshot_fd: int | None = None  # opened at the first write, kept open
        trace_dir = os.environ.get(TRACE_ENV)
        self._trace = None
        if trace_dir:  # a directory not there yet is made (a missing one failed the engine)
            os.makedirs(trace_dir, exist_ok=True)
            self._trace = open(os.path.join(trace_dir, f"trace-{os.getpid()}.jsonl"), "a")

    @property
    def mode(self) -> str:
        return self.controller.kind

    def verified(self, req_ids: list[str], num_draft_tokens: list[int] | None) -> None:
        self._scheduled = dict(zip(req_ids, num_draft_tokens or []))

    def begin(self, req_ids: list[str], sampled_token_ids: list[list[int]]) -> None:
        now = time.perf_counter()
        pending, self._pending = self._pending, None
        scheduled, self._scheduled = self._scheduled, {}
        if self.controller.kind != "auto" and self._trace is None:
            return
        batch = tuple(req_ids)
        clean = pending is not None and batch == pending.req_ids and all(sampled_token_ids)
        seconds = self._shared(now - pending.start if clean else 0.0)
        if pending is None:
            return
        drafted = pending.drafted  # only requests that drafted (``end``)
        if clean and not drafted and not scheduled and self._trace is None:
            self._plain_step(batch, seconds)  # the usual step where drafts do not pay
            return
        if drafted:
            outcomes = []
            for req_id, committed in zip(req_ids, sampled_token_ids):
                k = min(drafted.get(req_id, 0), scheduled.get(req_id, 0))
                if committed:
                    outcomes.append((req_id, k, len(committed) - 1 if k else 0))
        else:  # a plain step (the usual one where drafts do not pay): nothing verified
            outcomes = [(req_id, 0, 0) for req_id, committed
                        in zip(req_ids, sampled_token_ids) if committed]
        rows = len(req_ids) + (sum(scheduled.get(r, 0) for r in req_ids) if scheduled else 0)
        drafting = any(drafted.values())
        depth = max(drafted.values(), default=0)  # what the drafter ran for
        self._record(req_ids, rows, drafting, clean, seconds, outcomes, depth=depth)

    def _plain_step(self, batch: tuple[str, ...], seconds: float) -> None:
        """:meth:`_record` of a step that drafted nothing, verified nothing and ran the same
        batch as the one before (every request committed its one token): the same updates
        without building the generic step's outcome lists (on 2 CPU cores a plain step's
        plugin work was 4-6% of the step, issue 22)."""
        n = len(batch)
        if self.counting is not None:
            self.counting.plain_step(batch)
        if seconds > 0:
            self.controller.record_step(n, False, seconds, n, n, 0)
        self._forget_departed(batch)

    def measuring(self) -> bool:
        """Whether work is timed at all: ``auto``, or a trace is being written."""
        return self.controller.kind == "auto" or self._trace is not None

    def round_done(self, live: list[str], rows: int, drafting: bool, clean: bool,
                   seconds: float, outcomes: list[tuple[str, int, int]]) -> None:
        """A unit of work its proposer timed itself instead of a step (``proposers/dllm.py``:
        one denoising round, ``rows`` nodes forwarded), recorded as a step is; ``outcomes``:
        (req_id, drafted, accepted) of the requests it verified, ``live``: the batch's
        requests. A collective under TP: every rank calls it for every round while
        :meth:`measuring`."""
        if self.measuring():
            self._record(live, rows, drafting, clean, self._shared(seconds if clean else 0.0),
                         outcomes, unit="round")
            self._maybe_log()

    def _record(self, live: list[str], rows: int, drafting: bool, clean: bool, seconds: float,
                outcomes: list[tuple[str, int, int]], unit: str = "", depth: int = 0) -> None:
        if self._trace is not None:
            line = {"t": round(time.perf_counter(), 6), "rows": rows, "drafting": drafting,
                    "clean": clean, "seconds": seconds,
                    "requests": outcomes, **({"unit": unit} if unit else {}),
                    **({"depth": depth} if depth else {}),
                    # what the controller expected of each verified chain, position by position
                    # (before this step's outcomes: how well it predicts, trace_losses)
                    "gains": {r: [round(g, 4) for g in self.controller.expected(r, k)]
                              for r, k, _ in outcomes if k},
                    **({"guarded": True} if self.controller.last.guarded else {}),
                    **({"probe": True} if self.controller.last.probe else {}),
                    **({"closed": True} if self.controller.last.closed else {}),
                    **({"lost": True} if self.controller.last.lost else {}),
                    **({"mode": self.controller.kind} if self.controller.kind != "auto" else {})}
            self._trace.write(json.dumps(line) + "\n")
            self._trace.flush()
        if self.controller.kind != "auto":
            return
        counted = outcomes if self.counting is None else self.counting.counted(outcomes)
        for req_id, k, accepted in counted:
            if k:
                self.controller.record_verified(req_id, k, accepted)
        if self.counting is not None:  # every chain's first draft checks its price
            heads = {req_id for req_id, k, _ in counted if k}
            for req_id, k, accepted in outcomes:
                if k and req_id not in heads:
                    self.controller.record_head(req_id, accepted > 0)
        for req_id, k, accepted in outcomes:  # each chain as it was: the next one's class
            if k:
                self.controller.record_chain(req_id, k, accepted)
        if clean and seconds > 0:
            # progress: one per request and its accepted drafts (a step's committed tokens;
            # a denoising round's baseline steps moved, the currency its goodput is in)
            tokens = len(outcomes) + sum(a for _, _, a in outcomes)
            self.controller.record_step(rows, drafting, seconds, len(outcomes), tokens, depth)
        self._forget_departed(tuple(live))

    def _forget_departed(self, live: tuple[str, ...]) -> None:
        """Drop the state of requests that left since the last call (else nothing to do)."""
        if live != self._live:
            self._live = live
            live_set = set(live)
            self.controller.forget(live_set)
            if self.counting is not None:
                self.counting.forget(live_set)

    def caps(self, req_ids: list[str], limits: list[int],
             remaining: Callable[[], list[int] | None] | None = None) -> list[int]:
        """``remaining()``: tokens each request has left at most (closed batches,
        core/budget_drain; asked only there)."""
        return self.controller.allot(req_ids, limits, remaining)

    def end(self, req_ids: list[str], chains: list[list[int]], start: float) -> None:
        self._pending = _Pending(tuple(req_ids),
                                 {r: len(c) for r, c in zip(req_ids, chains) if c}, start)
        self._maybe_log()

    def _shared(self, seconds: float) -> float:
        """Rank 0's measurement on every rank (a collective: every rank calls it every step)."""
        if self.tp_group is None:
            return seconds
        return float(self.tp_group.broadcast_object(seconds, src=0))

    def _maybe_log(self) -> None:
        if self.controller.kind != "auto":
            return
        now = time.monotonic()
        if self._snapshot is not None and now - self._snapshot_at >= 1.0:
            self._snapshot_at = now
            self._write_snapshot()
        if self._log_every <= 0:
            return
        if now - self._logged >= self._log_every:
            self._logged = now
            if self.tp_group is None or self.tp_group.rank_in_group == 0:
                logger.info("vllm_anyorder: %s", self.controller.summary())

    def _write_snapshot(self) -> None:
        """Rewrite the snapshot in place, one fixed-size write (the reader skips a torn read:
        ``metrics.BudgetStatLogger.log``). Not a new file renamed over the old: on a VM's ext4
        (``discard``) that rename took 204 ms inside an engine step, twice in 527 steps, and
        such a step stalls every request of the batch (issue 22)."""
        self.controller.flush()  # the cost model, with every plain step held back
        d = self.controller.last
        state = {"cost_slope_s_per_row": self.controller.cost.slope(), "last_rows": d.rows,
                 "predicted_gain": d.goodput / d.plain_goodput if d.plain_goodput else 0.0}
        data = json.dumps(state).encode().ljust(SNAPSHOT_BYTES)  # trailing spaces: valid JSON
        try:
            if self._snapshot_fd is None:
                self._snapshot_fd = os.open(self._snapshot, os.O_RDWR | os.O_CREAT, 0o644)
                weakref.finalize(self, os.close, self._snapshot_fd)  # closed with the budget
                os.ftruncate(self._snapshot_fd, 0)
            os.pwrite(self._snapshot_fd, data, 0)
        except OSError:
            self._snapshot = None  # metrics are optional; never fail a step over them

    def digest(self) -> str:
        """Fingerprint of everything the controller's decisions depend on."""
        state = json.dumps(self.controller.state(), sort_keys=True)
        return hashlib.sha256(state.encode()).hexdigest()[:16]

    def stats(self) -> dict[str, Any]:
        self.controller.flush()
        return {"mode": self.mode, **self.controller.totals,
                "cost_slope_ms_per_row": self.controller.cost.slope() * 1e3,
                "last_rows": self.controller.last.rows, "summary": self.controller.summary()}
