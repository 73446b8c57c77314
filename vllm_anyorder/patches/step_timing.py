"""Diagnostic patch: where an engine step's time goes, as the worker sees it (opt-in)."""

from __future__ import annotations

import functools
import time

ENV = "VLLM_ANYORDER_STEP_TIMING"
# a gap longer than this between two steps is the engine idling (between batches), not a step
IDLE_GAP_S = 0.25
# running sums in this worker process; read them with collective_rpc (benchmarks/bench_floor.py)
TOTALS: dict[str, float] = {"calls": 0, "steps": 0, "period_s": 0.0, "execute_s": 0.0,
                            "forward_s": 0.0, "sample_s": 0.0, "rows": 0, "draft_steps": 0}
_LAST_START = [0.0]


def apply_step_timing() -> None:
    """Sum, per worker process, how long each engine step takes and what part of it the model.

    Why: the cost a speculative engine adds on steps where no request drafts (the issue-22
    "drafts-off floor") is a fraction of a millisecond, while whole-run wall clock on 2 CPU
    cores moves by 10-25% between engine instances and over minutes (the forward alone took
    2.0-3.0 ms at batch 1 in six engines of one run). Only a per-step split of the same run
    tells the model's time from the engine's: ``period - forward`` is the engine's own cost
    per step (scheduling, IPC, sampling, the proposer), comparable across engines.
    What: wraps ``GPUModelRunner.execute_model``, ``._model_forward`` and ``.sample_tokens``
    (inherited by the V1 ``CPUModelRunner``) with timers that add to :data:`TOTALS`:
    ``calls`` (of ``execute_model``), ``steps`` and ``period_s`` (from one ``execute_model``
    start to the next; gaps over :data:`IDLE_GAP_S` are idling and skipped), ``execute_s``,
    ``forward_s``, ``sample_s`` (per call: divide by ``calls``), ``rows`` (the tokens each
    step scheduled) and ``draft_steps`` (steps that scheduled draft tokens: verifications, and
    requests vLLM padded to ``[token, -1 x k]``): two engines' forwards compare only at equal
    rows per step.
    Applied at ``register()`` only when ``VLLM_ANYORDER_STEP_TIMING=1``; nothing changes
    otherwise.
    Checked: vLLM 0.32.0 (``v1/worker/gpu_model_runner.py:3940`` ``execute_model``, ``:3620``
    ``_model_forward``, ``:4304`` ``sample_tokens``).
    Remove: when vLLM's own per-step tracing splits the model forward from the rest.
    """
    from vllm_anyorder import _compat

    runner = _compat.gpu_model_runner_cls()
    runner.execute_model = _timed(runner.execute_model, "execute_s", starts_step=True)
    runner._model_forward = _timed(runner._model_forward, "forward_s")
    runner.sample_tokens = _timed(runner.sample_tokens, "sample_s")


def _timed(fn, key: str, starts_step: bool = False):
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        if starts_step:
            TOTALS["calls"] += 1
            out = args[1] if len(args) > 1 else kwargs.get("scheduler_output")
            TOTALS["rows"] += getattr(out, "total_num_scheduled_tokens", 0)
            TOTALS["draft_steps"] += bool(getattr(out, "scheduled_spec_decode_tokens", None))
            gap = start - _LAST_START[0]
            if _LAST_START[0] and gap <= IDLE_GAP_S:
                TOTALS["steps"] += 1
                TOTALS["period_s"] += gap
            _LAST_START[0] = start
        try:
            return fn(*args, **kwargs)
        finally:
            TOTALS[key] += time.perf_counter() - start

    return timed


def per_step(sums: dict) -> dict:
    """Milliseconds per step from :data:`TOTALS` (or the difference of two readings): period,
    forward, engine (period - forward: the engine's own work) and ``sample_tokens``."""
    calls, steps = max(1, sums["calls"]), max(1, sums["steps"])
    period = 1e3 * sums["period_s"] / steps
    forward = 1e3 * sums["forward_s"] / calls
    return {"period": period, "forward": forward, "engine": period - forward,
            "sample": 1e3 * sums["sample_s"] / calls, "rows": sums.get("rows", 0) / calls,
            "draft_steps": sums.get("draft_steps", 0) / calls}
