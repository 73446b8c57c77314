"""One side-by-side comparison: engines per method on the same prompts, warmed up, timed in
interleaved rounds (min / median), acceptance from vLLM's own counters, exact match against
each row's lossless reference (the no-speculation greedy output); prints a table and writes a
JSON file. Rows run grouped by reference, one group's engines alive at a time.

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
            repeats: int = 3, batch: int = 0, describe: str = "", plots: bool = True,
            max_engines: int = 0) -> list[dict]:
    """Rows are run grouped by their reference (see :func:`_groups`), groups one after the
    other: only one group's engines (``max_engines`` at most, 0 = no limit) are alive at once."""
    from tqdm import tqdm

    names = {c.name for c in configs}
    unknown = {c.reference for c in configs if c.reference} - names
    if len(names) != len(configs) or unknown:
        raise ValueError(f"config names must be unique and references known (unknown: {unknown})")
    groups = _groups(configs, max_engines)
    first, probes, seconds, paired, memory = {}, {}, {}, {}, []
    for g, (head, chunks) in enumerate(groups, 1):
        label = f"group {g}/{len(groups)} ({head.name})"
        engines = {head.name: _start(head, target, prompts, params, batch, first, probes)}
        seconds[head.name] = []
        for chunk in chunks:
            for cfg in tqdm(chunk, desc=f"{label}: engines (start + acceptance pass)"):
                engines[cfg.name] = _start(cfg, target, prompts, params, batch, first, probes)
            memory.append(dict(reference=head.name, engines=list(engines), rss_gib=round(_rss_gib(), 2)))
            times = {name: [] for name in engines}
            for _ in tqdm(range(repeats), desc=f"{label}: timing rounds"):
                for name, llm in engines.items():  # interleaved: each round runs every engine once
                    times[name].append(timed_generate(llm, name, prompts, params, warmup=False,
                                                      batch=batch).seconds)
            seconds[head.name] += times[head.name]
            for cfg in chunk:  # timed side by side with the reference's rounds of this chunk
                seconds[cfg.name], paired[cfg.name] = times[cfg.name], times[head.name]
                close(engines.pop(cfg.name))
        close(engines.pop(head.name))

    rows = []
    for cfg in configs:
        name, run = cfg.name, first[cfg.name]
        reference = cfg.reference or configs[0].name
        base = paired.get(name) or seconds[reference]  # a reference: its own or another group's
        med = statistics.median(seconds[name])
        ref = first[reference].outputs
        row = dict(
            method=name, family=cfg.family or name, k=cfg.k, reference=reference,
            interleaved_with_reference=name in paired or reference == name,
            seconds_min=min(seconds[name]), seconds_median=med, seconds=seconds[name],
            reference_seconds_median=statistics.median(base),
            generated=run.generated, tokens_per_s=run.generated / med,
            speedup_vs_nospec=statistics.median(base) / med,
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
                                   max_engines=max_engines, groups=memory, rows=rows), indent=1))
    print(f"wrote {out.relative_to(REPO)}")
    if plots:
        from benchmarks.plots import write_plots

        for path in write_plots(rows, out.with_suffix(""), f"{machine()}\n{describe}"):
            print(f"wrote {path.relative_to(REPO)}")
    return rows


def _start(cfg: Config, target: Path, prompts, params, batch: int, first: dict, probes: dict):
    """Start one engine, warm it up and run its acceptance pass (stored in first / probes).

    vLLM keeps one Prometheus registry per process and a new engine unregisters the previous
    one's metrics, so an engine's acceptance counters are read right after it starts."""
    llm = make_engine(cfg.model or target, cfg.speculative_config, cfg.additional_config)
    # warm-up, outside the probe too; params: one SamplingParams or one per prompt
    llm.generate(prompts[:2], params_for(params, 0, 2), use_tqdm=False)
    before = cfg.probe(llm) if cfg.probe else {}
    first[cfg.name] = timed_generate(llm, cfg.name, prompts, params, warmup=False, batch=batch)
    after = cfg.probe(llm) if cfg.probe else {}
    probes[cfg.name] = {k: after[k] - before.get(k, 0) for k in after}
    return llm


def _rss_gib() -> float:
    """Resident memory of this process and its children (the engines' processes), GiB."""
    import psutil

    procs = [psutil.Process()]
    procs += procs[0].children(recursive=True)
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**30


def _groups(configs: list[Config], max_engines: int) -> list[tuple[Config, list[list[Config]]]]:
    """Rows grouped by the row they are compared with: (reference, chunks of the other rows).

    A reference is the first row or any row another row names. A group's engines are alive
    together; with ``max_engines`` a bigger group runs in chunks, the reference's engine
    staying alive and timed in every chunk, interleaved with that chunk's rows."""
    named = {c.reference for c in configs if c.reference}
    heads = [c for i, c in enumerate(configs) if i == 0 or c.name in named]
    out = []
    for head in heads:
        rest = [c for c in configs if c not in heads and (c.reference or configs[0].name) == head.name]
        n = max(1, -(-len(rest) // (max_engines - 1))) if max_engines > 1 and rest else 1
        size = -(-len(rest) // n) if rest else 1
        out.append((head, [rest[i : i + size] for i in range(0, max(1, len(rest)), size)]))
    return out


def _print(rows: list[dict], describe: str, repeats: int) -> None:
    print(f"\nmachine: {machine()}; {describe}; {repeats} interleaved rounds")
    print(f"{'method':<28}{'tok/fwd':>8}{'median s':>10}{'min s':>8}{'speedup':>9}{'exact':>7}"
          f"{'drafter ms/step':>16}  vs (* = not interleaved with it)")
    for r in rows:
        cost = f"{r['drafter_ms_per_step']:>16.1f}" if "drafter_ms_per_step" in r else f"{'':>16}"
        vs = ("itself" if r["reference"] == r["method"] else r["reference"]) + (
            "" if r["interleaved_with_reference"] else " *")
        print(f"{r['method']:<28}{r['tokens_per_target_forward']:>8.2f}{r['seconds_median']:>10.2f}"
              f"{r['seconds_min']:>8.2f}{r['speedup_vs_nospec']:>8.2f}x{r['exact_match']:>7.0%}{cost}"
              f"  {vs}")
    for r in rows:
        if "tokens_per_model_forward" in r:
            print(f"  {r['method']}: {r['tokens_per_model_forward']:.2f} tokens per model forward "
                  f"({r['model_forwards']} model forwards, drafting included)")
    for r in rows:
        if r["accepted_per_position"]:
            print(f"  accepted by position, {r['method']}: {r['accepted_per_position'][:20]}")
