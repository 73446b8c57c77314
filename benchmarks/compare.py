"""One side-by-side comparison: engines per method on the same prompts, warmed up, timed in
interleaved rounds (min / median), acceptance from vLLM's own counters, exact match against
the no-speculation greedy output; prints a table and writes a JSON file.

Every benchmark script is a list of ``Config`` rows handed to :func:`compare`.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from benchmarks.common import REPO, close, machine, make_engine, params_for, timed_generate

# workers are asked for drafter diagnostics with collective_rpc(function)
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")


@dataclass
class Config:
    name: str
    speculative_config: dict | None = None
    additional_config: dict | None = None
    model: Path | None = None  # None: the benchmark's target
    # probe(llm) -> dict of extra counters read from the engine after a pass (e.g. drafter cost)
    probe: Callable | None = None
    family: str = ""  # for plots: configurations of one method at several k
    k: int = 0  # drafts per step (gamma, block size, ...)
    reference: str = ""  # config whose outputs/time this one is compared with (default: first)


def drafter_probe(llm) -> dict:
    """Drafter forwards and seconds so far, from the first worker's proposer."""
    def read(worker):
        d = worker.model_runner.drafter
        return {"drafter_forwards": getattr(d, "drafter_forwards", 0),
                "drafter_seconds": getattr(d, "drafter_seconds", 0.0),
                "drafter_calls": getattr(d, "drafter_calls", 0)}

    return llm.collective_rpc(read)[0]


def assd_probe(llm) -> dict:
    """Query-stream drafting forwards so far (``assd`` self-drafting; 0 with ngram drafts)."""
    def read(worker):
        return {"query_forwards": getattr(worker.model_runner.drafter, "query_forwards", 0)}

    return llm.collective_rpc(read)[0]


def compare(tag: str, target: Path, configs: list[Config], prompts: list, params,
            repeats: int = 3, batch: int = 0, describe: str = "",
            plots: bool = True) -> list[dict]:
    from tqdm import tqdm

    # vLLM keeps one Prometheus registry per process and a new engine unregisters the
    # previous one's metrics, so each engine's acceptance counters are read right after it
    # starts (warm-up + one measured pass); the timing rounds then run interleaved.
    engines, first, probes = {}, {}, {}
    for cfg in tqdm(configs, desc="engines (start + acceptance pass)"):
        llm = make_engine(cfg.model or target, cfg.speculative_config, cfg.additional_config)
        engines[cfg.name] = llm
        # warm-up, outside the probe too
        llm.generate(prompts[:2], params_for(params, 0, 2), use_tqdm=False)
        before = cfg.probe(llm) if cfg.probe else {}
        first[cfg.name] = timed_generate(llm, cfg.name, prompts, params, warmup=False, batch=batch)
        after = cfg.probe(llm) if cfg.probe else {}
        probes[cfg.name] = {k: after[k] - before.get(k, 0) for k in after}
    seconds = {name: [] for name in engines}
    for _ in tqdm(range(repeats), desc="timing rounds"):
        for name, llm in engines.items():  # interleaved: each round runs every method once
            seconds[name].append(timed_generate(llm, name, prompts, params, warmup=False,
                                                batch=batch).seconds)
    for llm in engines.values():
        close(llm)

    rows = []
    for name, run in first.items():
        med = statistics.median(seconds[name])
        cfg = next(c for c in configs if c.name == name)
        reference = cfg.reference or configs[0].name
        ref, base_med = first[reference].outputs, statistics.median(seconds[reference])
        row = dict(
            method=name, family=cfg.family or name, k=cfg.k, reference=reference,
            seconds_min=min(seconds[name]), seconds_median=med,
            generated=run.generated, tokens_per_s=run.generated / med,
            speedup_vs_nospec=base_med / med,
            tokens_per_target_forward=run.mean_acceptance_length,
            accepted_per_position=run.accepted_per_pos, target_forwards_with_drafts=run.drafts,
            exact_match=sum(a == b for a, b in zip(run.outputs, ref)) / len(ref),
            **probes[name])
        if "query_forwards" in row:  # drafting forwards count too: tokens per model forward
            row["model_forwards"] = run.generated - run.accepted + row["query_forwards"]
            row["tokens_per_model_forward"] = run.generated / row["model_forwards"]
        elif "model_forwards" in row:  # the probe counted every model forward itself
            row["tokens_per_model_forward"] = run.generated / max(1, row["model_forwards"])
        if row.get("drafter_calls"):
            row["drafter_ms_per_step"] = 1e3 * row["drafter_seconds"] / row["drafter_calls"]
        rows.append(row)
    _print(rows, describe, repeats)
    out = REPO / "benchmarks" / "results" / f"{tag}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(machine=machine(), describe=describe, repeats=repeats,
                                   rows=rows), indent=1))
    print(f"wrote {out.relative_to(REPO)}")
    if plots:
        from benchmarks.plots import write_plots

        for path in write_plots(rows, out.with_suffix(""), f"{machine()}\n{describe}"):
            print(f"wrote {path.relative_to(REPO)}")
    return rows


def _print(rows: list[dict], describe: str, repeats: int) -> None:
    print(f"\nmachine: {machine()}; {describe}; {repeats} interleaved rounds")
    print(f"{'method':<28}{'tok/fwd':>8}{'median s':>10}{'min s':>8}{'speedup':>9}{'exact':>7}"
          f"{'drafter ms/step':>16}")
    for r in rows:
        cost = f"{r['drafter_ms_per_step']:>16.1f}" if "drafter_ms_per_step" in r else f"{'':>16}"
        print(f"{r['method']:<28}{r['tokens_per_target_forward']:>8.2f}{r['seconds_median']:>10.2f}"
              f"{r['seconds_min']:>8.2f}{r['speedup_vs_nospec']:>8.2f}x{r['exact_match']:>7.0%}{cost}")
    for r in rows:
        if "tokens_per_model_forward" in r:
            print(f"  {r['method']}: {r['tokens_per_model_forward']:.2f} tokens per model forward "
                  f"({r['model_forwards']} model forwards, drafting included)")
    for r in rows:
        if r["accepted_per_position"]:
            print(f"  accepted by position, {r['method']}: {r['accepted_per_position'][:20]}")
