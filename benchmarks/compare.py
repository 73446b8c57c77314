"""One side-by-side comparison, one engine alive at a time.

Every benchmark script is a list of ``Config`` rows handed to :func:`compare`. A round runs
every row once (the starting row rotates from round to round, so drift hits every row alike);
a row-run is a child process (:mod:`benchmarks.isolated`) that starts the row's engine, warms
it up, times one pass over the prompts, reads vLLM's spec-decode counters and the row's probe,
and shuts the engine down before the next row-run starts. Before each row-run the harness
waits for the 1-minute load average to fall to half the cores (``cooldown_s`` at most); a
row-run that started above that, or shared the CPU with other processes (``foreign_cpu``: busy
CPU time of processes outside the harness, in cores), is re-run once, then kept and marked.

Each row reports the median and min/max of its rounds, the ratio of medians to its reference
row (the first row unless ``reference`` names another), the paired ratio (the median over
rounds of each round's own ratio: less exposed to the machine's drift), exact match against the reference's
output in every round, and what the timing depended on (dtype, load averages, engines alive).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from benchmarks.common import REPO, cpu_dtype, machine, machine_info, repetition_share
from benchmarks.isolated import QUIET_FOREIGN_CPU, run_row, wait_quiet

# workers are asked for drafter diagnostics with collective_rpc(function)
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")


@dataclass
class Config:
    name: str
    speculative_config: dict | None = None
    additional_config: dict | None = None
    model: Path | None = None  # None: the benchmark's target
    # probe(llm) -> dict of counters read from the engine (deltas over the timed pass are kept);
    # a module-level function (the row runs in a child process)
    probe: Callable | None = None
    family: str = ""  # for plots: configurations of one method at several k
    k: int = 0  # drafts per step (gamma, block size, ...)
    reference: str = ""  # config whose outputs/time this one is compared with (default: first)
    env: dict | None = None  # environment of the row's child process (e.g. the attention)


def drafter_probe(llm) -> dict:
    """Drafter forwards and seconds so far, from the first worker's proposer."""
    def read(worker):
        d = worker.model_runner.drafter
        return {"drafter_forwards": getattr(d, "drafter_forwards", 0),
                "drafter_seconds": getattr(d, "drafter_seconds", 0.0),
                "drafter_calls": getattr(d, "drafter_calls", 0)}

    return llm.collective_rpc(read)[0]


def dllm_probe(llm) -> dict:
    """Model forwards so far: vLLM's own (one per engine step) and the proposer's."""
    def read(worker):
        m = worker.model_runner.model
        return {"engine_forwards": m.target_forwards, "row_forwards": m.row_forwards}

    c = llm.collective_rpc(read)[0]
    return {**c, "model_forwards": c["engine_forwards"] + c["row_forwards"]}


def assd_probe(llm) -> dict:
    """Query-stream drafting forwards so far (``assd`` self-drafting; 0 with ngram drafts)."""
    def read(worker):
        return {"query_forwards": getattr(worker.model_runner.drafter, "query_forwards", 0)}

    return llm.collective_rpc(read)[0]


def compare(tag: str, target: Path, configs: list[Config], prompts: list, params,
            repeats: int = 3, batch: int | list[int] = 0, describe: str = "", plots: bool = True,
            cooldown_s: float = 90.0, write: bool = True) -> list[dict]:
    """``batch``: requests submitted together (0 = all); a list times each setting with the
    same engine in every row-run (one row per setting, compared within the setting)."""
    from tqdm import tqdm

    batches = batch if isinstance(batch, list) else [batch]

    names = [c.name for c in configs]
    unknown = {c.reference for c in configs if c.reference} - set(names)
    if len(set(names)) != len(configs) or unknown:
        raise ValueError(f"config names must be unique and references known (unknown: {unknown})")
    dtype, why = cpu_dtype()
    print(f"[bench] dtype {dtype}: {why}; {machine()}; one engine alive at a time, "
          f"{repeats} rounds x {len(configs)} rows")
    runs: dict[str, list[dict]] = {name: [] for name in names}
    with tqdm(total=repeats * len(configs), desc=f"{tag}: row-runs") as bar:
        for r in range(repeats):
            for i in range(len(configs)):
                cfg = configs[(i + r) % len(configs)]  # rotate the first row every round
                bar.set_postfix_str(f"round {r + 1}: {cfg.name}")
                runs[cfg.name].append(_measured(cfg, target, prompts, params, batches, cooldown_s))
                bar.update(1)
    rows = [_row(cfg, runs, configs, i, len(batches) > 1) for i in range(len(batches))
            for cfg in configs]
    _print(rows, describe, repeats)
    if not write:
        return rows
    out = REPO / "benchmarks" / "results" / f"{tag}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(machine=machine_info(), dtype=dtype, dtype_why=why,
                                   describe=describe, repeats=repeats, harness=__doc__.split("\n\n")[1],
                                   rows=rows), indent=1))
    print(f"wrote {out.relative_to(REPO)}")
    if plots:
        from benchmarks.plots import write_plots

        for path in write_plots(rows, out.with_suffix(""), f"{machine()}, {dtype}\n{describe}"):
            print(f"wrote {path.relative_to(REPO)}")
    return rows


def _measured(cfg: Config, target: Path, prompts, params, batches: list[int],
              cooldown_s: float) -> dict:
    """One row-run in a child process; re-run once if the machine was not quiet."""
    for attempt in range(2):
        waited = wait_quiet(cooldown_s)
        before = os.getloadavg()
        run = run_row(cfg, cfg.model or target, prompts, params, batches)
        run.update(loadavg_before=[round(x, 2) for x in before], waited_s=round(waited, 1),
                   loadavg_after=[round(x, 2) for x in os.getloadavg()], attempt=attempt + 1)
        run["quiet"] = (before[0] <= (os.cpu_count() or 1) / 2
                        and max(p["foreign_cpu"] for p in run["passes"]) <= QUIET_FOREIGN_CPU)
        if run["quiet"]:
            break
    return run


def _row(cfg: Config, runs: dict[str, list[dict]], configs: list[Config], b: int,
         label_batch: bool) -> dict:
    """The row of ``cfg`` at its ``b``-th batch setting (each round's pass ``b``)."""
    reference = cfg.reference or configs[0].name
    mine = [{**run, **run["passes"][b]} for run in runs[cfg.name]]
    ref = [{**run, **run["passes"][b]} for run in runs[reference]]
    seconds = [r["seconds"] for r in mine]
    med, ref_med = statistics.median(seconds), statistics.median(r["seconds"] for r in ref)
    first = mine[0]
    ref_out = ref[0]["outputs"]
    exact = min(sum(a == b for a, b in zip(r["outputs"], ref_out)) / len(ref_out) for r in mine)
    generated = sum(len(o) for o in first["outputs"])
    suffix = f" [batch {first['batch'] or 'all'}]" if label_batch else ""
    row = dict(
        method=cfg.name + suffix, family=(cfg.family or cfg.name) + suffix, k=cfg.k,
        reference=reference + suffix, batch=first["batch"],
        seconds_median=med, seconds_min=min(seconds), seconds_max=max(seconds), seconds=seconds,
        reference_seconds_median=ref_med, speedup_vs_nospec=ref_med / med,
        speedup_min_max=[min(ref_med / s for s in seconds), max(ref_med / s for s in seconds)],
        # the median of each round's own ratio: this machine's speed drifts by +-10% over
        # minutes, and a round's row-runs are minutes apart while rounds are many minutes apart
        speedup_paired=statistics.median(r["seconds"] / m["seconds"] for m, r in zip(mine, ref)),
        generated=generated, tokens_per_s=generated / med,
        tokens_per_target_forward=first["mean_acceptance_length"],
        accepted_per_position=first["accepted_per_pos"],
        target_forwards_with_drafts=first["drafts"],
        same_acceptance_every_round=len({r["accepted"] for r in mine}) == 1,
        exact_match=exact, dtype=first["dtype"],
        engines_alive_max=max(r["engines_alive_max"] for r in mine),
        loadavg_before=[r["loadavg_before"] for r in mine],
        loadavg_after=[r["loadavg_after"] for r in mine],
        foreign_cpu=[r["foreign_cpu"] for r in mine],
        all_rounds_quiet=all(r["quiet"] for r in mine),
        reruns=sum(r["attempt"] - 1 for r in mine),
        engine_start_s=statistics.median(r["start_s"] for r in mine),
        first_output=first["outputs"][0],
        repetition_4gram=repetition_share(first["outputs"]),
        **({"probe_rounds": [r["probe"] for r in mine]} if first["probe"] else {}),
        **first["probe"])
    if "query_forwards" in row:  # drafting forwards count too: tokens per model forward
        row["model_forwards"] = generated - first["accepted"] + row["query_forwards"]
        row["tokens_per_model_forward"] = generated / row["model_forwards"]
    elif "model_forwards" in row:  # the probe counted every model forward itself
        row["tokens_per_model_forward"] = generated / max(1, row["model_forwards"])
    if row.get("drafter_calls"):
        row["drafter_ms_per_step"] = 1e3 * row["drafter_seconds"] / row["drafter_calls"]
    return row


def _print(rows: list[dict], describe: str, repeats: int) -> None:
    print(f"\nmachine: {machine()}; dtype {rows[0]['dtype'] if rows else '?'}; {describe}; "
          f"{repeats} rounds, one engine alive at a time")
    print(f"{'method':<30}{'tok/fwd':>8}{'median s':>10}{'min-max s':>13}{'speedup':>9}"
          f"{'paired':>8}{'exact':>7}{'quiet':>7}{'drafter ms/step':>16}  vs")
    for r in rows:
        cost = f"{r['drafter_ms_per_step']:>16.1f}" if "drafter_ms_per_step" in r else f"{'':>16}"
        vs = "itself" if r["reference"] == r["method"] else r["reference"]
        spread = f"{r['seconds_min']:.2f}-{r['seconds_max']:.2f}"
        print(f"{r['method']:<30}{r['tokens_per_target_forward']:>8.2f}{r['seconds_median']:>10.2f}"
              f"{spread:>13}{r['speedup_vs_nospec']:>8.2f}x{r['speedup_paired']:>7.2f}x"
              f"{r['exact_match']:>7.0%}"
              f"{'yes' if r['all_rounds_quiet'] else 'NO':>7}{cost}  {vs}")
    for r in rows:
        if "tokens_per_model_forward" in r:
            print(f"  {r['method']}: {r['tokens_per_model_forward']:.2f} tokens per model forward "
                  f"({r['model_forwards']} model forwards, drafting included)")
    for r in rows:
        if r["accepted_per_position"]:
            print(f"  accepted by position, {r['method']}: {r['accepted_per_position'][:20]}")
    refs = {r["reference"]: r for r in rows if r["reference"] == r["method"]}
    print("  repetition share of the reference output (repeated 4-grams): "
          + ", ".join(f"{m}: {r['repetition_4gram']:.0%}" for m, r in refs.items()))
    loud = [r["method"] for r in rows if not r["all_rounds_quiet"]]
    if loud:
        print(f"  NOT QUIET (load average > cores/2 before, or other processes' CPU during, "
              f"a round even after a re-run): {', '.join(loud)}")
