"""In-process paired rounds: small per-step differences between rows, without the engines'
instance spread.

On a 2-core VM the same engine setting run in two engine processes differs by 10-25% in
wall clock, and a row-run's forward alone moved by up to 30% between instances (issue 22,
``benchmarks/RESULTS.md``); a 3% floor cannot be read through that. Here every row's engine
is built once in THIS process with vLLM's EngineCore in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``): an engine that is not generating runs nothing, so
still one engine works at a time. Each round times every row's pass back to back in a
rotated order, so rows share the machine's slow and fast minutes and the ratio of each
round is paired. What this leaves out: the executor's message queues between processes
(the same for every row of one method, and measured by ``compare``'s harness).

vLLM's spec-decode counters: each engine's Prometheus logger unregisters the ones before it
(``v1/metrics/loggers.py:490``), so only the last-built engine's counters are readable; the
other rows report ``drafts`` and ``tokens_per_target_forward`` as None, and every row its
engine steps per pass (``probe_rounds``: ``calls``).

Rows come back in ``compare``'s shape (``method``, ``batch``, ``reference``,
``speedup_vs_nospec`` = the median of each round's ratio, ``probe_rounds``, outputs checked
against the reference), so ``bench_floor --in-process`` reuses its table.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import REPO, Run, machine, machine_info, make_engine, \
    repetition_share, timed_generate
from benchmarks.isolated import cpu_snapshot, own_cpu

# a step_timing gap longer than this is idling (patches/step_timing.IDLE_GAP_S = 0.25 s):
# passes of different engines must not read as one run of steps
_BETWEEN_PASSES_S = 0.3


def compare_in_process(tag: str, target: Path, configs: list, prompts: list, params,
                       repeats: int = 3, batch: list[int] | None = None,
                       describe: str = "", **_ignored) -> list[dict]:
    """``compare.compare``'s rows, measured in one process (see the module docstring)."""
    envs = {json.dumps(cfg.env or {}, sort_keys=True) for cfg in configs}
    if len(envs) > 1:
        raise SystemExit("--in-process: every row must run with the same environment")
    os.environ.update(configs[0].env or {})
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    batches = batch or [0]
    engines = {}
    for cfg in configs:
        engines[cfg.name] = make_engine(cfg.model or target, cfg.speculative_config,
                                        cfg.additional_config)
        engines[cfg.name].generate(prompts[:2], params, use_tqdm=False)  # warm-up
    dtype = str(next(iter(engines.values())).llm_engine.vllm_config.model_config.dtype)
    rows = []
    for b in batches:
        runs: dict[str, list[dict]] = {cfg.name: [] for cfg in configs}
        for r in range(repeats):
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            for cfg in order:
                runs[cfg.name].append(_pass(cfg, engines[cfg.name], prompts, params, b))
        new = [_row(cfg, runs, configs, b, dtype.replace("torch.", ""),
                    counters=cfg is configs[-1]) for cfg in configs]
        for cfg, row in zip(configs, new):
            if row["exact_match"] < 1 and getattr(params, "temperature", None) == 0:
                ref = cfg.reference or configs[0].name
                row["divergences"] = divergences(engines[ref], prompts, params,
                                                  runs[ref][0]["outputs"], runs[cfg.name])
        rows += new
    _print(rows, describe, repeats)
    out = REPO / "benchmarks" / "results" / f"{tag}-inprocess-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(machine=machine_info(), describe=describe, repeats=repeats,
                                   harness=__doc__.split("\n\n")[1], rows=rows), indent=1))
    print(f"wrote {out.relative_to(REPO)}")
    return rows


def divergences(ref_llm, prompts: list, params, ref: list, mine: list[dict],
                 most: int = 4) -> list[dict]:
    """Where a greedy row's outputs left the reference's: the first differing token of up to
    ``most`` (round, prompt) pairs, and the reference's own top-2 log-probabilities there (asked
    again after the timed rounds, alone, its prompt the prompt and the shared output before
    that token: asked from the prompt alone, a batch-1 run can leave the batch's output at an
    earlier near-tie and report another context's gap, as at `specdiff` batch 8 on Zen 4,
    token 119, 0.94). A gap of a few thousandths is a near-tie that the batch's shape flips in
    bf16 (vLLM's numerics, not the method's rule; the tests compare in float32); a wide gap
    would be a wrong token. ``agrees``: which of the two tokens the lone run picks there."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    found = []
    for r, run in enumerate(mine):
        for i, (a, b) in enumerate(zip(ref, run["outputs"])):
            if a != b and len(found) < most:
                pos = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                found.append(dict(round=r, prompt=i, token=pos, reference=a[pos:pos + 1],
                                  row=b[pos:pos + 1]))
    tokenizer = ref_llm.get_tokenizer()
    for d in found:
        ask = SamplingParams(temperature=0, max_tokens=1, logprobs=2,
                             ignore_eos=params.ignore_eos)
        prompt = prompts[d["prompt"]]
        ids = list(tokenizer(prompt).input_ids) if isinstance(prompt, str) else list(prompt)
        shared = ref[d["prompt"]][:d["token"]]
        out = ref_llm.generate([TokensPrompt(prompt_token_ids=ids + shared)], ask,
                               use_tqdm=False)[0].outputs[0]
        top = sorted(out.logprobs[0].items(), key=lambda kv: -kv[1].logprob)[:2]
        d["top2"] = [[t, round(v.logprob, 5)] for t, v in top]
        d["gap"] = round(top[0][1].logprob - top[-1][1].logprob, 5)
        d["agrees"] = ("reference" if [top[0][0]] == d["reference"] else
                       "row" if [top[0][0]] == d["row"] else "neither")
    return found


@dataclass
class Pass:
    """One timed pass (:func:`timed_pass`)."""
    run: Run
    counters: dict  # how much each of ``probe(llm)``'s counters grew over it ({}: no probe)
    load_before: float  # the 1-minute load average as it began
    foreign_cpu: float  # CPU seconds other processes took, per second of the pass


def timed_pass(llm, prompts, params, batch: int, probe=None, name: str = "") -> Pass:
    """One timed pass of ``llm`` over ``prompts`` (``batch`` at a time; 0: all at once), after
    a pause that keeps passes apart, with ``probe(llm)``'s counters read either side of it
    (e.g. over ``collective_rpc``: outside the timed region)."""
    time.sleep(_BETWEEN_PASSES_S)
    load = os.getloadavg()[0]
    before = probe(llm) if probe else {}
    cpu0 = cpu_snapshot()
    run = timed_generate(llm, name, prompts, params, warmup=False, batch=batch)
    cpu1 = cpu_snapshot()
    after = probe(llm) if probe else {}
    foreign = max(0.0, (cpu1[0] - cpu0[0]) - own_cpu(cpu0[1], cpu1[1])) / run.seconds
    return Pass(run, {k: after[k] - before.get(k, 0) for k in after}, load, foreign)


def _pass(cfg, llm, prompts, params, batch: int) -> dict:
    p = timed_pass(llm, prompts, params, batch, cfg.probe, cfg.name)
    run = p.run
    return dict(seconds=run.seconds, outputs=run.outputs, drafts=run.drafts,
                accepted=run.accepted, tokens_per_forward=run.mean_acceptance_length,
                probe=p.counters, loadavg_before=round(p.load_before, 2),
                foreign_cpu=round(p.foreign_cpu, 3))


def _row(cfg, runs: dict[str, list[dict]], configs: list, batch: int, dtype: str,
         counters: bool = True) -> dict:
    """``counters``: this row's engine's spec-decode counters were readable (the last built)."""
    reference = cfg.reference or configs[0].name
    mine, ref = runs[cfg.name], runs[reference]
    ref_out = ref[0]["outputs"]
    ratios = [f["seconds"] / m["seconds"] for m, f in zip(mine, ref)]
    label = f" [batch {batch or 'all'}]"
    return dict(
        method=cfg.name + label, reference=reference + label,
        batch=batch, dtype=dtype, seconds=[m["seconds"] for m in mine],
        speedup_vs_nospec=statistics.median(ratios), speedup_rounds=ratios,
        exact_match=min(sum(a == b for a, b in zip(m["outputs"], ref_out)) / len(ref_out)
                        for m in mine),
        tokens_per_target_forward=mine[0]["tokens_per_forward"] if counters else None,
        drafts=mine[0]["drafts"] if counters else None,
        repetition_4gram=repetition_share(mine[0]["outputs"]),
        loadavg_before=[m["loadavg_before"] for m in mine],
        foreign_cpu=[m["foreign_cpu"] for m in mine],
        **({"probe_rounds": [m["probe"] for m in mine]} if mine[0]["probe"] else {}))


def _print(rows: list[dict], describe: str, repeats: int) -> None:
    print(f"\nmachine: {machine()}; dtype {rows[0]['dtype']}; {describe}; {repeats} rounds, "
          f"all engines in one process, one generating at a time")
    print(f"{'row':<48}{'tok/fwd':>8}{'paired':>8}{'min-max':>12}{'exact':>7}{'foreign cpu':>12}")
    for r in rows:
        spread = f"{min(r['speedup_rounds']):.2f}-{max(r['speedup_rounds']):.2f}"
        per_forward = r["tokens_per_target_forward"]
        per_forward = f"{per_forward:>8.2f}" if per_forward is not None else f"{'n/a':>8}"
        print(f"{r['method']:<48}{per_forward}"
              f"{r['speedup_vs_nospec']:>7.2f}x{spread:>12}{r['exact_match']:>7.0%}"
              f"{max(r['foreign_cpu']):>12.2f}")
    for r in rows:
        for d in r.get("divergences", []):
            print(f"  {r['method']}: round {d['round']} prompt {d['prompt']} left the reference at "
                  f"token {d['token']} ({d['reference']} -> {d['row']}); the reference's top-2 "
                  f"log-probabilities there differ by {d['gap']:.5f}")
