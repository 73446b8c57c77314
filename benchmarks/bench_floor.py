"""The drafts-off floor, per engine step: what a speculative engine whose proposer drafts
nothing (``budget: cycle:0``) costs over no speculation, split into the model's time and the
engine's own (issue 22: "overhead when the controller drafts nothing <= 3% of a
no-speculation step").

Whole-run wall clock cannot settle this on a 2-core VM: the model forward alone moves by
10-30% between engine instances and over minutes, the same for both rows. Every row-run here
also turns on the ``step_timing`` diagnostic patch (``VLLM_ANYORDER_STEP_TIMING=1``), which
sums in the worker, per step, the period from one ``execute_model`` to the next, the model
forward and ``sample_tokens``. ``engine = period - forward`` is the cost of the step that is
not the model (scheduling, IPC, sampling, the proposer); the floor is the drafts-off row's
``engine`` minus no speculation's in the same round, over no speculation's period.
``in forwards``: the step's period over its own forward, against no speculation's in the same
round. The VM's speed moves between a round's two passes, and this ratio moves much less
than milliseconds do; it is valid where both rows run the same forward, as drafts off does.

    .venv/bin/python -m benchmarks.bench_floor [--method jacobi] [--batch 1 8] [--repeats 3]
        [--with-auto] [--second-budget cycle:1] [--in-process]

``--in-process`` builds every row's engine in this one process and pairs their passes
round by round (``benchmarks/paired.py``): the floor without the engine-instance spread (and
without the message queues between processes).

``--with-auto`` adds the method's defaults under ``auto`` as a third row, so the same rounds
show whether a gap is the floor or the steps ``auto`` drafts (its "floor" columns then read
as its engine part over no speculation's). ``--second-budget cycle:1`` runs the second row
with one draft per request every step instead of none: what one drafting step costs, split
into the target's forward and ``sample_tokens`` (where a drafter runs).

Same harness as every table (``compare``: one engine alive, rows rotated over the rounds,
quiet-machine checks); the wall-clock speed-ups are printed too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import configs as C  # noqa: E402
from benchmarks.bench_budget import TARGETS, _default_row, _with_budget, random_twin  # noqa: E402
from benchmarks.common import REPO, load_prompts, machine_info  # noqa: E402
from benchmarks.compare import Config, compare  # noqa: E402
from vllm_anyorder.patches.step_timing import per_step  # noqa: E402

TIMING_ENV = {"VLLM_ANYORDER_STEP_TIMING": "1"}


def step_probe(llm) -> dict:
    """The worker's step sums so far (``patches/step_timing.py``)."""
    def read(worker):
        from vllm_anyorder.patches import step_timing

        return dict(step_timing.TOTALS)

    return llm.collective_rpc(read)[0]


def floor_table(rows: list[dict]) -> list[dict]:
    """One line per row and batch: medians over rounds, and the paired floor of each
    drafts-off row (its engine ms minus the reference's, same round, over the reference's
    period)."""
    by_name = {r["method"]: r for r in rows}
    out = []
    for r in rows:
        mine = [per_step(p) for p in r["probe_rounds"]]
        ref = [per_step(p) for p in by_name[r["reference"]]["probe_rounds"]]
        line = {"row": r["method"], "batch": r["batch"], "speedup_wall": r["speedup_vs_nospec"],
                **{f"{k}_ms": statistics.median(m[k] for m in mine) for k in mine[0]}}
        if r["reference"] != r["method"]:
            line["floor_engine"] = statistics.median(
                (m["engine"] - f["engine"]) / f["period"] for m, f in zip(mine, ref))
            line["floor_step"] = statistics.median(
                (m["period"] - f["period"]) / f["period"] for m, f in zip(mine, ref))
            # the step counted in the row's own forwards: a slow minute slows both alike, so
            # this moves far less between rounds than milliseconds do (no speculation's period
            # 2.1-4.6 ms, its period / forward 1.89-2.11 in four rounds, Zen 4, 2026-12-04);
            # only for rows whose forward is the reference's (drafts off: the same rows)
            ratios = [(m["period"] / m["forward"]) / (f["period"] / f["forward"]) - 1
                      for m, f in zip(mine, ref) if m["forward"] > 0 and f["forward"] > 0]
            line["floor_forwards"] = statistics.median(ratios) if ratios else None
        out.append(line)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", choices=sorted(TARGETS), default="jacobi")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--with-auto", action="store_true", help="also time the defaults (auto)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--trace", default=None, help="with --with-auto: the auto row's budget "
                    "trace directory (python -m benchmarks.trace_losses DIR)")
    ap.add_argument("--target", type=Path, default=None, help="an AR target other than the "
                    "method's default (e.g. models/ar-target-large, the README's serve model)")
    ap.add_argument("--random-target", action="store_true",
                    help="a random-weight twin of the target (drafts almost never accepted)")
    ap.add_argument("--in-process", action="store_true",
                    help="every row's engine in this process, paired passes "
                         "(benchmarks/paired.py): no engine-instance spread, no IPC")
    ap.add_argument("--second-budget", default="cycle:0",
                    help="the second row's budget (cycle:0: drafts off; cycle:1: one draft each)")
    args = ap.parse_args()

    from vllm import SamplingParams

    base = Config("no-spec (asarm)", model=C.ASARM) if args.method == "assd" else C.no_spec()
    label = "drafts off" if args.second_budget == "cycle:0" else "drafts"
    off = _with_budget(_default_row(args.method), args.method, args.second_budget, label)
    off.name = off.family = f"{args.method} defaults, {label} ({args.second_budget})"
    configs = [base, off] + ([_default_row(args.method)] if args.with_auto else [])
    for row in configs:
        row.env, row.probe = dict(TIMING_ENV), step_probe
    if args.trace and args.with_auto:  # the auto row's steps, for benchmarks/trace_losses.py
        Path(args.trace).mkdir(parents=True, exist_ok=True)
        configs[-1].env["VLLM_ANYORDER_BUDGET_TRACE"] = str(Path(args.trace).resolve())
    prompts = load_prompts(args.prompts)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens,
                            ignore_eos=True, seed=0 if args.temperature else None)
    if (args.target or args.random_target) and args.method == "assd":
        raise SystemExit("--target / --random-target: AR targets only (jacobi, specdiff)")
    target = args.target or TARGETS[args.method]
    if args.random_target:
        target = random_twin(target)
    sampling = f"T={args.temperature}" if args.temperature else "greedy"
    from benchmarks.paired import compare_in_process

    name = f"floor-{args.method}{'-random' if args.random_target else ''}"
    harness = compare_in_process if args.in_process else compare
    rows = harness(name, target, configs, prompts, params, repeats=args.repeats,
                   batch=args.batch, plots=False,
                   describe=f"model {target.name}; {len(prompts)} prompts x {args.max_tokens} "
                            f"tokens, {sampling}; step timing on")
    table = floor_table(rows)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name += "-inprocess" if args.in_process else ""
    out = REPO / "benchmarks" / "results" / f"{name}-{stamp}-steps.json"
    out.write_text(json.dumps({"machine": machine_info(), "steps": table,
                               "rounds": {r["method"]: [per_step(p) for p in r["probe_rounds"]]
                                          for r in rows}}, indent=1))
    print(f"\n{'row':<40}{'period ms':>10}{'forward':>9}{'engine':>8}{'sample':>8}"
          f"{'floor: engine':>15}{'whole step':>12}{'in forwards':>12}{'wall':>7}")
    for line in table:
        forwards = line.get("floor_forwards")
        floor = (f"{line['floor_engine']:>+14.1%} {line['floor_step']:>+11.1%}"
                 + (f"{forwards:>+12.1%}" if forwards is not None else f"{'-':>12}")
                 if "floor_engine" in line else f"{'':>39}")
        print(f"{line['row']:<40}{line['period_ms']:>10.2f}{line['forward_ms']:>9.2f}"
              f"{line['engine_ms']:>8.2f}{line['sample_ms']:>8.2f}{floor}"
              f"{line['speedup_wall']:>6.2f}x")
    print(f"wrote {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
