"""The plugin's own work per engine step (issue 22: "overhead when the controller drafts
nothing <= 3% of a no-speculation step"), measured where it runs, without the engine's noise.

Two measurements:

* ``--controller``: the speculation budget alone (``proposers/budget.StepBudget`` around
  ``core/budget.BudgetController``), fed a simulated engine (a plain step of 4 ms plus 0.3 ms
  per row; every draft rejected, or each accepted with ``--accept``), microseconds per step
  of ``verified`` + ``begin`` + ``caps`` + ``end``, the calls a proposer makes each step.
* default: an engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no IPC, so the
  step's time is the worker's own), ``jacobi`` at T=0.8 on the random-weight twin of
  ``models/ar-target`` (drafts never accepted: ``auto`` drafts almost nothing), with the
  proposer's hooks timed: milliseconds per step of ``propose`` (budget + drafting) and
  ``observe_verification``, next to the whole step.

    .venv/bin/python -m benchmarks.bench_step_overhead --controller [--batch 1 8 16] [--closed 128]
    .venv/bin/python -m benchmarks.bench_step_overhead --controller --digest --closed 128
        (simulated time: the same decisions every run, hashed; a refactor of the controller
        that means to change nothing must print the same digests)
    .venv/bin/python -m benchmarks.bench_step_overhead [--budget auto] [--batch 1 16]

Figures: benchmarks/RESULTS.md ("The plugin's per-step work"). Timings on a 2-core VM move
by 10-20% between runs; compare settings within one run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class SimClock:
    """``time`` for the budget's adapter that moves only as the simulated engine's steps say:
    every step then measures the same seconds and the decisions repeat run after run
    (``--digest``; with real time a step's few microseconds of Python differ every run)."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return time.monotonic()


def controller_us(batch: int, accept: float, steps: int = 3000, seed: int = 0,
                  closed: int = 0, digest=None) -> float:
    """Microseconds per step of the budget's calls under a simulated engine. ``closed``: every
    request generates this many tokens and leaves, and a new batch starts when all have left
    (closed batches, ``core/budget_drain``: the controller values drains); 0: one open batch of
    endless requests. ``digest`` (a hashlib object): the budget measures simulated time
    (:class:`SimClock`) and every step's caps are hashed into it."""
    import random

    import vllm_anyorder.proposers.budget as budget_module
    from vllm_anyorder.core.jacobi_refined import RefinedPositions
    from vllm_anyorder.proposers.budget import StepBudget

    clock = SimClock() if digest is not None else None
    real_time = budget_module.time
    if clock is not None:
        budget_module.time = clock
    try:
        return _controller_steps(StepBudget, RefinedPositions, random.Random(seed), batch,
                                 accept, steps, closed, clock, digest)
    finally:
        budget_module.time = real_time


def _controller_steps(StepBudget, RefinedPositions, rng, batch: int, accept: float,
                      steps: int, closed: int, clock, digest) -> float:
    """:func:`controller_us`'s loop."""
    budget = StepBudget("auto", 16, counting=RefinedPositions())
    batches = 0
    req_ids = [f"r{i}" for i in range(batch)]
    left = [closed] * batch
    caps, spent = [0] * batch, 0.0
    for _ in range(steps):
        sampled = [[1] * (1 + sum(1 for _ in range(k) if rng.random() < accept)) for k in caps]
        start = time.perf_counter()
        budget.verified(req_ids, caps if any(caps) else None)
        if budget._pending is not None:  # the step "took" what the simulated engine says
            took = 0.004 + 0.0003 * (batch + sum(caps))
            if clock is not None:
                clock.now = budget._pending.start + took
            else:
                budget._pending.start = time.perf_counter() - took
        budget.begin(req_ids, sampled)
        if closed:  # the finished requests leave; the next batch once all have
            spent += time.perf_counter() - start
            left = [max(0, n - len(s)) for n, s in zip(left, sampled)]
            req_ids = [r for r, n in zip(req_ids, left) if n]
            left = [n for n in left if n]
            if not req_ids:
                batches += 1
                req_ids, left = [f"b{batches}-{i}" for i in range(batch)], [closed] * batch
            start = time.perf_counter()
        limits = [min(16, n - 1) for n in left] if closed else [16] * len(req_ids)
        caps = budget.caps(req_ids, limits, (lambda: list(left)) if closed else None)
        for req_id, cap in zip(req_ids, caps):
            if cap:
                budget.counting.drafted(req_id, 0)
        budget.end(req_ids, [[5] * c for c in caps],
                   clock.now if clock is not None else time.perf_counter())
        spent += time.perf_counter() - start
        if digest is not None:
            digest.update(repr(caps).encode())
    return 1e6 * spent / steps


def engine_ms(budget: str, batches: list[int]) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm_anyorder.proposers.jacobi import JacobiProposer

    from benchmarks.common import cpu_dtype, load_prompts, timed_method

    spent, calls = defaultdict(float), defaultdict(int)

    def recorder(name: str):
        def record(seconds: float, args, kwargs) -> None:
            spent[name] += seconds
            calls[name] += 1
        return record

    for name in ("propose", "observe_verification"):
        timed_method(JacobiProposer, name, recorder(name))
    from vllm import LLM, SamplingParams

    from benchmarks.bench_budget import TARGETS, random_twin

    llm = LLM(str(random_twin(TARGETS["jacobi"])), dtype=cpu_dtype()[0], max_model_len=512,
              speculative_config={"method": "jacobi", "num_speculative_tokens": 16},
              additional_config={"anyorder": {"jacobi": {"budget": budget}}})
    prompts = load_prompts(16)
    params = SamplingParams(temperature=0.8, max_tokens=128, ignore_eos=True, seed=0)
    llm.generate(prompts[:2], params, use_tqdm=False)  # warm-up
    for batch in batches:
        spent.clear()
        calls.clear()
        start = time.perf_counter()
        for i in range(0, max(4, batch), batch):
            llm.generate(prompts[i:i + batch], params, use_tqdm=False)
        wall = time.perf_counter() - start
        steps = max(1, calls["propose"])
        print(f"batch {batch:>2} budget {budget}: {steps} steps, {1e3 * wall / steps:.3f} ms "
              f"per step; propose {1e3 * spent['propose'] / steps:.3f} ms, "
              f"observe_verification {1e3 * spent['observe_verification'] / steps:.3f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--controller", action="store_true", help="the budget alone, no engine")
    ap.add_argument("--batch", type=int, nargs="+", default=None)
    ap.add_argument("--accept", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--budget", default="auto")
    ap.add_argument("--closed", type=int, default=0, help="--controller: closed batches of "
                    "requests of this many tokens (0: one open batch)")
    ap.add_argument("--digest", action="store_true", help="--controller: simulated time, and "
                    "a digest of every decision (a refactor must leave it unchanged)")
    args = ap.parse_args()
    if args.controller:
        import hashlib

        kind = f"closed batches of {args.closed}-token requests" if args.closed else "open"
        every = hashlib.sha256() if args.digest else None
        for batch in args.batch or [1, 8, 16]:
            for accept in args.accept:
                digest = hashlib.sha256() if args.digest else None
                us = controller_us(batch, accept, closed=args.closed, digest=digest)
                tail = f"; decisions {digest.hexdigest()[:16]}" if digest is not None else ""
                if every is not None:
                    every.update(digest.digest())
                print(f"batch {batch:>2} ({kind}), drafts accepted with p={accept}: "
                      f"{us:.1f} us per step{tail}")
        if every is not None:
            print(f"all decisions {every.hexdigest()[:16]}")
        return 0
    engine_ms(args.budget, args.batch or [1, 16])
    return 0


if __name__ == "__main__":
    sys.exit(main())
