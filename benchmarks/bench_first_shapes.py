"""What a step costs the first time its row count runs, with and without the CPU row warm-up
(``vllm_anyorder/model_executor/cpu_row_warmup.py``; issue 22).

One fresh engine per setting (``VLLM_ANYORDER_CPU_WARMUP_SECONDS`` = 0, then the default),
each in its own process, one alive at a time: ``jacobi`` on ``models/ar-target`` in one
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), 4 prompts x 48 tokens under a sequence of
fixed draft sizes (``cycle:0,2,3,5,7,2``: row counts the warm-up's first pass meets), greedy.
For every decode row count met at least 4 times: ``execute_model``'s first step against the
median of its later ones. Reported: the mean extra of those first steps (the engine's first
decode step and prefill steps left out: the warm-up does not touch them), and the warm-up's
own time at load.

    .venv/bin/python -m benchmarks.bench_first_shapes            # both settings
    .venv/bin/python -m benchmarks.bench_first_shapes --seconds 0  # one setting, this process

Figures: benchmarks/RESULTS.md ("a new row count's first step").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODES = ("cycle:0", "cycle:2", "cycle:3", "cycle:5", "cycle:7", "cycle:2")


def one_engine(seconds: float) -> dict:
    """This process: one engine with the warm-up bounded to ``seconds``; first-step costs."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_ANYORDER_CPU_WARMUP_SECONDS"] = str(seconds)
    import functools

    from vllm import SamplingParams
    from vllm.v1.worker import cpu_model_runner

    from benchmarks.bench_switch import _row, _set_mode, _target
    from benchmarks.common import load_prompts, make_engine, timed_method
    from vllm_anyorder.model_executor import cpu_row_warmup

    warm = {}
    real_warm = cpu_row_warmup.warm_row_counts

    def timed_warm(model, most_rows, budget=None):
        start = time.perf_counter()
        warm["rows"] = real_warm(model, most_rows, budget)
        warm["seconds"] = round(time.perf_counter() - start, 3)
        return warm["rows"]

    import vllm_anyorder.proposers.base as base
    base.warm_row_counts = timed_warm
    first: dict[int, float] = {}
    later: dict[int, list[float]] = {}
    decode_steps = [0]

    def record(took: float, args, kwargs) -> None:
        scheduler_output = args[1] if len(args) > 1 else kwargs["scheduler_output"]
        # a decode step: no request's prompt is computed (each schedules 1 + its drafts)
        if not scheduler_output.scheduled_new_reqs:
            decode_steps[0] += 1
            rows = scheduler_output.total_num_scheduled_tokens
            if decode_steps[0] > 1 and rows not in first:
                first[rows] = took
            elif rows in first:
                later.setdefault(rows, []).append(took)

    timed_method(cpu_model_runner.CPUModelRunner, "execute_model", record)
    row = _row("jacobi")
    llm = make_engine(_target("jacobi"), row.speculative_config, row.additional_config)
    prompts = load_prompts(4)
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    for mode in MODES:
        llm.collective_rpc(functools.partial(_set_mode, mode=mode))
        llm.generate(prompts, params, use_tqdm=False)
    rows = {r: (first[r], statistics.median(v)) for r, v in later.items() if len(v) >= 3}
    extra = [f - m for f, m in rows.values()]
    return {"warmup_seconds_setting": seconds, "warmup": warm,
            "row_counts": len(rows), "mean_extra_ms": round(1e3 * statistics.mean(extra), 3),
            "per_row_count_ms": {r: [round(1e3 * f, 3), round(1e3 * m, 3)]
                                 for r, (f, m) in sorted(rows.items())}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=None,
                    help="one setting, in this process (0: no warm-up)")
    args = ap.parse_args()
    if args.seconds is not None:
        print("RESULT " + json.dumps(one_engine(args.seconds)))
        return
    from benchmarks.common import machine_info

    results = []
    for seconds in (0.0, 3.0):  # one engine alive at a time
        out = subprocess.run([sys.executable, "-m", "benchmarks.bench_first_shapes",
                              "--seconds", str(seconds)], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
        result = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
        results.append(result)
        print(f"warm-up {'off' if not seconds else 'on'}: first step at a decode row count "
              f"{result['mean_extra_ms']:.2f} ms over its later median "
              f"({result['row_counts']} row counts); warm-up at load {result['warmup']}")
    path = ROOT / "benchmarks" / "results" / time.strftime("first-shapes-%Y%m%d-%H%M%S.json")
    path.write_text(json.dumps({"machine": machine_info(), "runs": results}, indent=1))
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
