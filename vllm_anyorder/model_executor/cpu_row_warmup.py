"""Build the CPU matmul kernels of every row count a verification step may run, at load.

vLLM's CPU linear layers (``dispatch_cpu_unquantized_gemm``: oneDNN, or the AMX / zentorch
kernels where present) run a matmul primitive built for one row count M, built the first time
a step has M rows (measured on a 2-core Zen 4 VM, bf16, ``models/ar-target``: 0.3-0.8 ms per
layer shape, five shapes (qkv, o, gate-up, down, lm head): a decode step at a row count met
for the first time took 2.5-4.8 ms more than the same row count's later steps, which took
1.5-4.6 ms; 0.3-0.7 ms more after this warm-up; ``benchmarks/bench_first_shapes.py``,
issue 22). Plain decoding meets few row counts (its batch sizes); a speculative engine whose
budget sets each request's drafts step by step meets dozens (53 in one 32-prompt pass of
``jacobi`` at batch 4), and a fresh engine paid for each inside its first requests. Later
builds of a row count are cheap: oneDNN keeps its own cache of built kernels (1024 by
default, least recently used out first), which vLLM's per-shape cache of 32 falls back to.
That cache bounds the warm-up: row counts x layer shapes must leave room in it (1-507 rows
of 5 shapes, 2,535 kernels, pushed the small row counts out again: their first steps paid
as before).

So the proposer runs each distinct layer shape once at every row count up to the most a
verification step may schedule, at load, within ``budget`` seconds (a large model's big
matmuls cost more than their kernels' build: the budget stops it there). The dummy matmuls
write scratch tensors only: outputs cannot change. No vLLM import: it reads the layers'
``cpu_linear`` attribute, which vLLM's CPU platform sets (``patches/upstream.py`` expects it).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch

logger = logging.getLogger("vllm_anyorder")
BUDGET_ENV = "VLLM_ANYORDER_CPU_WARMUP_SECONDS"  # 0 turns it off (diagnosis, A/B runs)
DEFAULT_BUDGET = 3.0  # seconds
KERNEL_CACHE = 1024  # oneDNN's kernel cache (ONEDNN_PRIMITIVE_CACHE_CAPACITY's default)


def budget_seconds() -> float:
    """``$VLLM_ANYORDER_CPU_WARMUP_SECONDS`` (0 or less: off), else :data:`DEFAULT_BUDGET`; a
    value that is not a number is warned about and ignored (never a failed start-up)."""
    raw = os.environ.get(BUDGET_ENV, "")
    try:
        return float(raw) if raw.strip() else DEFAULT_BUDGET
    except ValueError:
        logger.warning("vllm_anyorder: %s=%r is not a number of seconds; using %.1f",
                       BUDGET_ENV, raw, DEFAULT_BUDGET)
        return DEFAULT_BUDGET


def verification_rows(max_num_seqs: int, max_drafts: int, max_batched_tokens: int) -> int:
    """The most rows one verification step may schedule: every request with its full chain,
    within the scheduler's token budget."""
    return max(1, min(max_num_seqs * (1 + max_drafts), max_batched_tokens))


def kernel_room(shapes: int) -> int:
    """Row counts whose kernels fit in half of oneDNN's cache (the rest: prefill shapes and
    what the engine built itself); ``$ONEDNN_PRIMITIVE_CACHE_CAPACITY`` where set."""
    env = os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY") or \
        os.environ.get("DNNL_PRIMITIVE_CACHE_CAPACITY")
    capacity = int(env) if env and env.isdigit() else KERNEL_CACHE
    return capacity // (2 * max(1, shapes))


def linear_shapes(model: torch.nn.Module) -> list[tuple[torch.nn.Module, int, torch.dtype]]:
    """One layer per distinct (in features, out features, dtype, bias) among the modules with
    a CPU matmul (``cpu_linear``), with its in features and input dtype; layers of one shape
    share their built kernels, so one of each suffices."""
    seen: dict[tuple, tuple[torch.nn.Module, int, torch.dtype]] = {}
    for module in model.modules():
        if not callable(getattr(module, "cpu_linear", None)):
            continue
        weight = getattr(module, "weight", None)
        k = getattr(module, "input_size_per_partition", None)
        n = getattr(module, "output_size_per_partition", None)
        if k is None and isinstance(weight, torch.Tensor) and weight.dim() == 2:
            n, k = weight.shape  # an embedding used as the lm head: [vocab, hidden]
        dtype = getattr(module, "params_dtype", None) or getattr(weight, "dtype", None)
        if not k or dtype is None:
            continue
        bias = getattr(module, "bias", None)
        key = (int(k), n, dtype, bias is not None)
        seen.setdefault(key, (module, int(k), dtype))
    return list(seen.values())


def warm_row_counts(model: Any, most_rows: int, budget: float | None = None) -> int:
    """Run every distinct CPU layer shape at 1..``most_rows`` rows (no more than
    :func:`kernel_room` keeps), in that order, until ``budget`` seconds are spent (None:
    :func:`budget_seconds`). Returns the row counts warmed (0: none, e.g. not a CPU engine).
    Never fails a start-up: an error stops the warm-up where it is."""
    if budget is None:
        budget = budget_seconds()
    if budget <= 0 or not isinstance(model, torch.nn.Module):
        return 0
    layers = linear_shapes(model)
    if not layers:
        return 0
    most_rows = min(most_rows, kernel_room(len(layers)))
    start, done = time.perf_counter(), 0
    try:
        with torch.inference_mode():
            for rows in range(1, most_rows + 1):
                for module, k, dtype in layers:
                    x = torch.zeros(rows, k, dtype=dtype)
                    module.cpu_linear(x, module.weight, getattr(module, "bias", None))
                done = rows
                if time.perf_counter() - start > budget:
                    break
    except Exception as exc:  # a layer this cannot drive: keep what was built
        logger.debug("vllm_anyorder: CPU row warm-up stopped at %d rows: %r", done + 1, exc)
    logger.info("vllm_anyorder: CPU matmul kernels built for 1-%d rows (%d layer shapes, "
                "%.2f s)", done, len(layers), time.perf_counter() - start)
    return done
