"""Worker-side view of an anyorder method's state, for tests, load tests and operators.

``AnyorderWorkerExtension`` is a vLLM worker extension (``--worker-extension-cls
vllm_anyorder.diagnostics.AnyorderWorkerExtension``, or ``worker_extension_cls=`` in
``LLM(...)``). It adds one worker method, ``anyorder_state()``, reachable with
``llm.collective_rpc("anyorder_state")`` or, on a server started with
``VLLM_SERVER_DEV_MODE=1``, ``POST /collective_rpc {"method": "anyorder_state"}``. It returns,
per rank, plain JSON: the process, whether ``register()`` ran there, the platform class, the
proposer's method and the sizes of its containers (per-request state is keyed by request id
and must shrink back once requests leave the batch), and a fingerprint of the state every TP
rank must hold identically (container keys and integer counters; timings are excluded).
``anyorder_set_budget_mode(mode)`` switches the budget controller's mode (a benchmark hook).
``anyorder_memory()`` tells a leak from allocator growth: bytes held by live tensors and
Python objects, against the C heap's in-use and free-but-kept bytes (glibc ``mallinfo2``).
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from typing import Any

_SIZED = (dict, set, frozenset, list, deque)


def container_sizes(obj: Any) -> dict[str, int]:
    """Length of every dict / set / list / deque attribute of ``obj`` (by attribute name)."""
    return {k: len(v) for k, v in sorted(vars(obj).items()) if isinstance(v, _SIZED)} \
        if obj is not None else {}


def fingerprint(obj: Any) -> str:
    """Digest of the keys of every dict attribute and every integer attribute of ``obj``."""
    if obj is None:
        return ""
    parts = []
    for name, value in sorted(vars(obj).items()):
        if isinstance(value, dict):
            parts.append(f"{name}:{sorted(map(str, value))}")
        elif isinstance(value, int) and not isinstance(value, bool):
            parts.append(f"{name}={value}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def state_of(worker: Any) -> dict[str, Any]:
    import vllm_anyorder
    from vllm.platforms import current_platform

    runner = getattr(worker, "model_runner", None)
    drafter = getattr(runner, "drafter", None)
    batch = getattr(runner, "input_batch", None)
    return {
        "pid": os.getpid(),
        "rank": getattr(worker, "rank", None),
        "registered": bool(vllm_anyorder._REGISTERED),
        "platform": type(current_platform).__name__,
        "method": getattr(drafter, "method", None) or None,
        "requests_in_batch": len(batch.req_ids) if batch is not None else 0,
        "containers": container_sizes(drafter),
        "fingerprint": fingerprint(drafter),
        # the speculation budget's state digest and counters (identical on every TP rank)
        "budget": _budget_of(drafter),
    }


def _budget_of(drafter: Any) -> dict[str, Any]:
    budget = getattr(drafter, "budget", None)
    if budget is None:
        return {}
    return {"digest": budget.digest(), **budget.stats()}


def memory_of() -> dict[str, float]:
    """MB held by live torch tensors (unique storages reachable from Python objects: the
    weights, the KV cache, anything kept), their count, and the C heap: bytes in use and
    bytes free but kept by the allocator (fragmentation / arena caching), from glibc's
    ``mallinfo2`` where available. A leak grows ``tensor_mb`` or ``heap_in_use_mb``; an
    allocator keeping freed memory grows ``heap_free_mb`` only."""
    import ctypes
    import gc

    import torch

    objects = gc.get_objects()
    storages: dict[int, int] = {}
    for obj in objects:
        try:
            if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
                st = obj.untyped_storage()
                storages[st.data_ptr()] = st.nbytes()
        except Exception:  # tensors without storage (meta, sparse, ...)
            continue
    out = {"tensor_mb": round(sum(storages.values()) / 2 ** 20, 1),
           "tensors": len(storages), "python_objects": len(objects)}
    del objects
    try:
        class MallInfo2(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in (
                "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                "uordblks", "fordblks", "keepcost")]

        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2
        info = libc.mallinfo2()
        out.update(heap_in_use_mb=round((info.uordblks + info.hblkhd) / 2 ** 20, 1),
                   heap_free_mb=round(info.fordblks / 2 ** 20, 1),
                   heap_mmapped_mb=round(info.hblkhd / 2 ** 20, 1))
    except (OSError, AttributeError):  # not glibc, or glibc < 2.33
        pass
    return out


class AnyorderWorkerExtension:
    """Mixed into vLLM's worker class by ``worker_extension_cls``."""

    def anyorder_state(self) -> dict[str, Any]:
        return state_of(self)

    def anyorder_memory(self) -> dict[str, float]:
        return memory_of()

    def anyorder_step_timing(self) -> dict[str, float]:
        """This worker's step sums (``patches/step_timing.py``; zeros unless the server runs
        with ``VLLM_ANYORDER_STEP_TIMING=1``)."""
        from vllm_anyorder.patches import step_timing

        return dict(step_timing.TOTALS)

    def anyorder_set_budget_mode(self, mode: str) -> str:
        """A benchmark hook: switch the live budget controller's mode (``auto``, ``fixed``,
        ``cycle:...``; what ``auto`` learnt is kept), so one server compares modes without
        the spread between server instances (``benchmarks/bench_serve.py --modes``)."""
        drafter = getattr(getattr(self, "model_runner", None), "drafter", None)
        if getattr(drafter, "budget", None) is None:
            raise ValueError("this engine runs no anyorder method")
        drafter.budget.controller.set_mode(mode)
        return drafter.budget.mode
