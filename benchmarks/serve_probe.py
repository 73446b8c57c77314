"""Where a live server's time goes during one client run (``bench_serve --probe``).

Two readings, taken before and after each ``vllm bench serve`` run against a server started
with ``VLLM_ANYORDER_STEP_TIMING=1`` (``patches/step_timing.py``):
- the worker's step sums over vLLM's dev-mode ``/collective_rpc``
  (``AnyorderWorkerExtension.anyorder_step_timing``): milliseconds per step of the period
  (one ``execute_model`` start to the next), the model forward, and the rest (``engine``:
  scheduling, the hand-offs between processes, sampling, the proposer);
- CPU seconds of each process of the server's tree (``psutil``), by process title (the API
  server, ``VLLM::EngineCore``, the worker): which process pays for a speculative path that
  drafts nothing, on 2 cores where the client shares them too.
"""

from __future__ import annotations

import psutil

from benchmarks.load_clients import _worker_rpc
from vllm_anyorder.patches.step_timing import per_step

TIMES = ("period", "forward", "engine", "sample")  # per_step's milliseconds (the rest: counts)


def snapshot(server) -> dict:
    """The worker's step sums and each server process's CPU seconds, now."""
    cpu = {}
    for p in server.tree():
        try:
            t = p.cpu_times()
            cpu[f"{p.pid}:{p.name()}"] = t.user + t.system
        except psutil.Error:
            continue
    return {"steps": _worker_rpc(server.base, "anyorder_step_timing")[0], "cpu": cpu}


def difference(before: dict, after: dict, tokens: int) -> dict:
    """Per step (ms) and per generated token (CPU ms per process) between two snapshots."""
    s0, s1 = before["steps"], after["steps"]
    split = per_step({k: s1[k] - s0[k] for k in s1})
    cpu = {name.split(":", 1)[1]: round(1e3 * (t - before["cpu"].get(name, 0.0))
                                        / max(1, tokens), 4)
           for name, t in after["cpu"].items()}
    return {"steps": int(s1["steps"] - s0["steps"]),
            **{f"{k}_ms" if k in TIMES else k: round(v, 4) for k, v in split.items()},
            "cpu_ms_per_token": cpu}
