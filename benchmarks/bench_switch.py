"""``auto`` against the method's fixed sizes on ONE engine: the budget mode is switched between
passes of the same engine instance (issue 22: "auto >= 0.95 x the best fixed setting").

Why one engine: on a 2-core VM two engines of the same setting differ by 10-25% in wall clock,
and in one process their forwards still differ by a few percent (``paired.py``); a row per
budget, each its own engine, measures the instances as much as the budgets (2026-11-28: batch
8, ``auto`` 1.02x against ``cycle:2`` 1.13x in per-row engines; 1.11x against 1.09x on one
engine in the same minutes). Here the method's engine is built once, in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), and every round times one pass per mode back to back in
a rotated order, the mode set between passes over ``collective_rpc`` (``BudgetController.
set_mode``). No speculation is a second engine, paired by round as in ``paired.py`` (its ratio
keeps the instance spread; the ratios between modes do not).

Modes: ``auto`` and ``cycle:k`` (k drafts per request every step; ``cycle:0``: the proposer
runs and drafts nothing). ``auto`` keeps what it learnt across its own passes (as a server
would); while another mode runs it learns nothing. A pass = ``--prompts`` submitted
``--batch`` at a time (closed batches, as ``bench_floor``).

    LD_PRELOAD=$PWD/.venv/lib/libiomp5.so .venv/bin/python -m benchmarks.bench_switch \\
        --method assd --batch 8 16 --modes auto cycle:1 cycle:2 cycle:3 [--temperature 0.8]

``--method ssd|freedave``: N / d = 4 on ``models/llada-dllm``, against ``stepwise``.

``--interleave``: within a round, every mode runs each closed batch of the pass in turn (the
mode switched between batches, not between passes), so all modes are timed on the same
prompts within a second of each other. On a VM whose speed drifts 10-30% between passes
(2026-12-01, 2-core Xeon: one mode's passes 3.0-4.5 s in one run) pass-level ratios
measure the drift; batch-level interleaving cancels it (a mode's round time is the sum of
its batches). Rotated per batch; ``auto`` learns only in its own batches, as before.

At T > 0, round r's requests carry ``seed=r`` (every mode the same seeds; no speculation and
``cycle:0`` draw the same texts). With one seed for every round, each mode drew one fixed
text per prompt in all rounds, so a row compared one draw of each mode's text, whatever the
number of rounds: on 12 prompts ``jacobi``'s ``cycle:4`` drew three loops (11% repeated
4-grams against no speculation's 6%) and read 1.11x (issue 22, Zen 4, 2026-12-08). ``exact``
compares each round with no speculation's texts of the same round; ``repeated`` is over every
round's texts.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import configs as C  # noqa: E402
from benchmarks.bench_budget import TARGETS, _default_row  # noqa: E402
from benchmarks.common import REPO, load_prompts, machine, machine_info, make_engine, \
    repetition_share  # noqa: E402
from benchmarks.paired import divergences, timed_pass  # noqa: E402

NO_SPEC = "no-spec"
DLLM_NODES = 4  # ssd's N / freedave's d under the budget (the README's serve lines)


def _target(method: str) -> Path:
    return C.LLADA if method in C.DLLM_DRAFTING else TARGETS[method]


def _row(method: str):
    """The method with no option but the ones it cannot do without, budget ``auto``; a dLLM
    method on ``models/llada-dllm`` (no speculation there is ``stepwise``)."""
    if method in C.DLLM_DRAFTING:
        return C.dllm(f"{method} defaults", method, k=DLLM_NODES, budget="auto")
    return _default_row(method)


def _set_mode(worker, mode: str) -> str:
    """On a worker: the drafter's budget controller to ``mode`` (a test hook)."""
    worker.model_runner.drafter.budget.controller.set_mode(mode)
    return mode


def _totals(worker) -> dict:
    """On a worker: the budget controller's running totals (steps, drafted, accepted, ...)."""
    budget = worker.model_runner.drafter.budget
    budget.controller.flush()  # records held back (core/budget_backlog) count their stalls then
    return dict(budget.controller.totals, propose_seconds=getattr(budget, "propose_seconds", 0.0))


def budget_totals(llm) -> dict:
    """The first worker's budget totals (a ``timed_pass`` probe)."""
    return llm.collective_rpc(_totals)[0]


def _pass(llm, prompts, params, batch: int, spec: bool) -> dict:
    """One timed pass; for the method's engine, what its budget did in it: engine steps,
    the share that drafted nothing, draft rows per step, and (``auto`` only, the one mode
    that counts verifications) the share of drafts accepted."""
    p = timed_pass(llm, prompts, params, batch, budget_totals if spec else None)
    out = dict(seconds=p.run.seconds, outputs=p.run.outputs, load=round(os.getloadavg()[0], 2))
    if spec:
        out["budget"] = _budget_summary(p.counters)
    return out


def _budget_summary(d: dict) -> dict:
    """What the budget did over a pass, from its counters' growth ``d``: engine steps, the
    share that drafted nothing, draft rows per step, and the share of drafts accepted."""
    steps = max(1, d["steps"])
    return dict(steps=d["steps"], plain_share=d["steps_without_drafts"] / steps,
                drafts_per_step=d["drafted"] / steps, probes=d["probes"],
                accepted_share=d["accepted"] / d["drafted"] if d["drafted"] else None,
                # the plugin's own work a step (budget + drafting: ``propose``), in the engine
                propose_us=1e6 * d.get("propose_seconds", 0.0) / steps)


def _counters(llm, spec: bool) -> dict:
    return budget_totals(llm) if spec else {}


def _interleaved_round(engines: dict, names: list[str], prompts, params, batch: int,
                       r: int) -> dict[str, dict]:
    """One round with the modes interleaved by closed batch: for each batch of ``batch``
    prompts, every mode in turn (rotated by batch and round); per mode, the sum of its batch
    times, its outputs and its budget counters' growth (the shape ``_pass`` gives)."""
    spent = {n: 0.0 for n in names}
    outputs: dict[str, list] = {n: [] for n in names}
    grown: dict[str, dict] = {n: {} for n in names}
    time.sleep(0.3)
    for j, start in enumerate(range(0, len(prompts), batch)):
        chunk = prompts[start:start + batch]
        k = (r + j) % len(names)
        for name in names[k:] + names[:k]:
            spec = name != NO_SPEC
            llm = engines[spec]
            if spec:
                llm.collective_rpc(functools.partial(_set_mode, mode=name))
            before = _counters(llm, spec)
            t0 = time.perf_counter()
            outs = llm.generate(chunk, params, use_tqdm=False)
            spent[name] += time.perf_counter() - t0
            outputs[name] += [list(o.outputs[0].token_ids) for o in outs]
            for key, v in _counters(llm, spec).items():
                grown[name][key] = grown[name].get(key, 0) + v - before.get(key, 0)
    out = {}
    for name in names:
        d = dict(seconds=spent[name], outputs=outputs[name], load=round(os.getloadavg()[0], 2))
        if name != NO_SPEC:
            d["budget"] = _budget_summary(grown[name])
        out[name] = d
    return out


def round_params(params, r: int):
    """Round ``r``'s sampling parameters: at T > 0 its requests carry ``seed=r``."""
    if not params.temperature:
        return params
    seeded = params.clone()
    seeded.seed = r
    return seeded


def measure(method: str, modes: list[str], batches: list[int], prompts: list, params,
            repeats: int, interleave: bool = False) -> list[dict]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    target = _target(method)
    row = _row(method)
    plain = make_engine(target, None, None)
    spec = make_engine(target, row.speculative_config, row.additional_config)
    for llm in (plain, spec):
        llm.generate(prompts[:2], params, use_tqdm=False)  # warm-up
    names = [NO_SPEC] + modes
    out = []
    for b in batches:
        runs: dict[str, list[dict]] = {n: [] for n in names}
        for r in range(repeats):
            sampling = round_params(params, r)
            if interleave:
                for name, d in _interleaved_round({False: plain, True: spec}, names, prompts,
                                                  sampling, b, r).items():
                    runs[name].append(d)
                continue
            for name in names[r % len(names):] + names[:r % len(names)]:
                if name != NO_SPEC:
                    spec.collective_rpc(functools.partial(_set_mode, mode=name))
                runs[name].append(_pass(plain if name == NO_SPEC else spec, prompts, sampling,
                                        b, name != NO_SPEC))
        ref = runs[NO_SPEC]
        for name in names:
            mine = runs[name]
            out.append(dict(
                mode=name, batch=b, seconds=[m["seconds"] for m in mine],
                vs_nospec=statistics.median(f["seconds"] / m["seconds"] for m, f in zip(mine, ref)),
                vs_auto=statistics.median(a["seconds"] / m["seconds"]
                                          for m, a in zip(mine, runs.get("auto", mine))),
                vs_auto_rounds=[round(a["seconds"] / m["seconds"], 3)
                                for m, a in zip(mine, runs.get("auto", mine))],
                exact=min(sum(x == y for x, y in zip(m["outputs"], f["outputs"]))
                          / len(prompts) for m, f in zip(mine, ref)),
                repetition_4gram=repetition_share([o for m in mine for o in m["outputs"]]),
                load=[m["load"] for m in mine], budget=[m.get("budget") for m in mine]))
            if out[-1]["exact"] < 1 and not params.temperature:  # a near-tie or a wrong token
                out[-1]["divergences"] = divergences(plain, prompts, params,
                                                      ref[0]["outputs"], mine)
    spec.collective_rpc(functools.partial(_set_mode, mode="auto"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", default="assd",
                    choices=sorted(TARGETS) + list(C.DLLM_DRAFTING))
    ap.add_argument("--modes", nargs="+", default=["auto", "cycle:1", "cycle:2", "cycle:3"])
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--interleave", action="store_true",
                    help="switch modes between closed batches, not passes (cancels drift)")
    args = ap.parse_args()
    from vllm import SamplingParams

    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens,
                            ignore_eos=True, seed=0 if args.temperature else None)
    rows = measure(args.method, args.modes, args.batch, load_prompts(args.prompts), params,
                   args.repeats, args.interleave)
    sampling = f"T={args.temperature}" if args.temperature else "greedy"
    print(f"\nmachine: {machine()}; {args.method} on {_target(args.method).name}, "
          f"{args.prompts} prompts x {args.max_tokens} tokens, {sampling}, {args.repeats} rounds; "
          f"one engine, its budget mode switched between "
          f"{'closed batches (interleaved)' if args.interleave else 'passes'}")
    print(f"{'mode':<10}{'batch':>6}{'vs no-spec':>12}{'vs auto':>9}{'exact':>7}{'repeated':>10}")
    for r in rows:
        print(f"{r['mode']:<10}{r['batch']:>6}{r['vs_nospec']:>11.2f}x{r['vs_auto']:>8.2f}x"
              f"{r['exact']:>7.0%}{r['repetition_4gram']:>10.0%}   vs auto by round: "
              + " ".join(f"{x:.2f}" for x in r["vs_auto_rounds"]))
    for r in rows:
        per = [x for x in r["budget"] if x]
        if per:
            acc = [x["accepted_share"] for x in per if x["accepted_share"] is not None]
            print(f"  {r['mode']} batch {r['batch']}: "
                  f"{statistics.mean(x['steps'] for x in per):.0f} steps per pass, "
                  f"{statistics.mean(x['plain_share'] for x in per):.0%} without drafts, "
                  f"{statistics.mean(x.get('propose_us', 0.0) for x in per):.0f} us a step in "
                  f"propose (budget + drafting)"
                  + (f", {statistics.mean(x['drafts_per_step'] for x in per):.1f} drafts "
                     f"per step, {statistics.mean(acc):.0%} accepted, "
                     f"{statistics.mean(x['probes'] for x in per):.0f} probes" if acc else ""))
    for r in rows:
        for d in r.get("divergences", []):
            print(f"  {r['mode']} batch {r['batch']}: round {d['round']} prompt {d['prompt']} "
                  f"left no speculation's output at token {d['token']} ({d['reference']} -> "
                  f"{d['row']}); no speculation's top-2 log-probabilities there differ by "
                  f"{d['gap']:.5f} (asked alone after the shared output, it picks: "
                  f"{d.get('agrees', '?')})")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = REPO / "benchmarks" / "results" / f"switch-{args.method}-{stamp}.json"
    path.write_text(json.dumps(dict(machine=machine_info(), sampling=sampling, rows=rows,
                                    interleaved=args.interleave,
                                    harness=__doc__.split("\n\n")[1]), indent=1))
    print(f"wrote {path.relative_to(REPO)}")


if __name__ == "__main__":
    main()
