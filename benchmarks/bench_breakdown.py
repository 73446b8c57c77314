"""Where an engine step's time goes, per method: vLLM's target forward, the plugin's drafting /
verification forwards, the plugin's Python and copies, and the rest of vLLM.

For each row (one engine at a time, each in its own spawned child process: built with
``benchmarks.common.make_engine``, warmed up with one generate of 2 prompts, measured, shut
down) and each batch size (``--batch 1 8``: prompts submitted b at a time), the worker-side
timers of ``benchmarks/breakdown.py`` split the wall clock of the timed pass into

1. target fwd  -- vLLM's model forward (+ logits) over the scheduled tokens;
2. draft fwd   -- model forwards issued by plugin code (specdiff's drafter, assd's
                  query-stream forwards, the dLLM node / repair forwards) or by vLLM's
                  draft_model drafter;
3. plugin py   -- time inside the plugin's propose / observe_verification / take_draft_probs
                  and its patched runner hooks, minus 2 (``kv copy``: of which the dLLM rows'
                  ``scratch_plan``, prefix KV blocks copied into scratch blocks; ``rule``: of
                  which the dLLM decision rule's vocabulary math, ``dllm_blocks.row_scores``:
                  argmax and float64 softmax of every masked row, the dLLM's sampler;
                  ``excl.``: plugin py without both, the share the <= 10% goal is about);
4. rest        -- wall minus 1-3: scheduler, front end, IPC between processes, input prep,
                  sampling, rejection sampler (``in worker``: the part inside the worker's
                  execute_model / sample_tokens, vLLM's own ngram / draft_model drafting
                  included; the remainder ran outside the worker).

Steps = ``execute_model`` calls; every number is an average per step (ms) and a share of wall.

    LD_PRELOAD=$PWD/.venv/lib/libiomp5.so .venv/bin/python benchmarks/bench_breakdown.py \\
        [--batch 1 8] [--prompts 8] [--max-tokens 128] [--rows jacobi assd]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(function)

from benchmarks import configs as C  # noqa: E402
from benchmarks.common import DEFAULT_MODEL, REPO, cpu_dtype, machine, machine_info  # noqa: E402
from benchmarks.compare import Config  # noqa: E402
from benchmarks.isolated import run_in_child, wait_quiet  # noqa: E402

PARTS = ("target_fwd", "draft_fwd", "plugin_py", "rest")


def rows(block: int) -> list[Config]:
    out = [C.no_spec(), C.ngram(8), C.draft_model(4), C.jacobi(8, 2), C.specdiff(8, 2),
           Config("no-spec (asarm)", model=C.ASARM), C.assd(5, "self"), C.assd(5, "ngram")]
    for name, method, k in (("stepwise (baseline)", "stepwise", 0), ("ssd N=4", "ssd", 4),
                            ("freedave d=4", "freedave", 4)):
        out.append(replace(C.dllm(name, method, k, "fixed", block), model=C.LLADA))
    for c in out:
        c.model = c.model or DEFAULT_MODEL
    return out


def split(name: str, batch: int, wall: float, timers: dict, generated: int) -> dict:
    """Per-step milliseconds and shares of the four parts, from the worker's timers."""
    s, n = timers["seconds"], timers["calls"]
    steps = max(1, n.get("steps", 0))
    target, draft = s.get("target_fwd", 0.0), s.get("draft_fwd", 0.0)
    plugin = s.get("plugin", 0.0) + s.get("kv_copy", 0.0) + s.get("rule", 0.0)
    worker_rest = s.get("worker", 0.0) + s.get("vllm_inner", 0.0) + s.get("vllm_drafter", 0.0)
    parts = {"target_fwd": target, "draft_fwd": draft, "plugin_py": plugin,
             "rest": wall - target - draft - plugin}
    ms = lambda x: 1e3 * x / steps  # noqa: E731
    return dict(
        method=name, batch=batch, steps=n.get("steps", 0), wall_s=wall, generated=generated,
        ms_per_step=ms(wall), **{f"{k}_ms": ms(v) for k, v in parts.items()},
        **{f"{k}_pct": 100 * v / wall for k, v in parts.items()},
        kv_copy_ms=ms(s.get("kv_copy", 0.0)), rule_ms=ms(s.get("rule", 0.0)),
        plugin_excl_pct=100 * s.get("plugin", 0.0) / wall, rest_in_worker_ms=ms(worker_rest),
        vllm_drafter_ms=ms(s.get("vllm_drafter", 0.0)),
        target_forwards=n.get("target_fwd", 0), draft_forwards=n.get("draft_fwd", 0),
        adds_up=target + draft + plugin <= wall, timers=timers)


def measure(cfg: Config, n_prompts: int, max_tokens: int, batches: list[int],
            ignore_eos: bool = False) -> dict:
    """One row in this (child) process: engine, warm-up, one timed pass per batch size."""
    from vllm import SamplingParams

    from benchmarks import breakdown
    from benchmarks.common import close, load_prompts, make_engine, timed_generate

    prompts = load_prompts(n_prompts)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)
    t0 = time.perf_counter()
    llm = make_engine(cfg.model, cfg.speculative_config, cfg.additional_config)
    start_s = time.perf_counter() - t0
    try:
        llm.generate(prompts[:2], params, use_tqdm=False)  # warm-up
        wrapped = llm.collective_rpc(breakdown.install)[0]
        out = []
        for b in batches:
            llm.collective_rpc(breakdown.reset)
            run = timed_generate(llm, cfg.name, prompts, params, warmup=False, batch=b)
            r = split(cfg.name, b, run.seconds, llm.collective_rpc(breakdown.read)[0],
                      run.generated)
            r.update(tokens_per_target_forward=run.mean_acceptance_length, drafts=run.drafts,
                     accepted=run.accepted)
            out.append(r)
    finally:
        close(llm)
    return {"start_s": start_s, "wrapped": wrapped, "results": out}


def table(results: list[dict]) -> str:
    head = (f"{'method':<22}{'b':>2}{'steps':>6}{'wall s':>8}{'ms/step':>8}  "
            f"{'target fwd':>13}{'draft fwd':>13}{'plugin py':>13}{'(kv copy)':>10}"
            f"{'(rule)':>8}{'excl.':>7}{'rest':>13}{'(in worker)':>12}")
    lines = [head, "-" * len(head)]
    for r in results:
        cells = "".join(f"{r[p + '_ms']:>7.1f} {r[p + '_pct']:>3.0f}%  " for p in PARTS[:3])
        lines.append(f"{r['method']:<22}{r['batch']:>2}{r['steps']:>6}{r['wall_s']:>8.2f}"
                     f"{r['ms_per_step']:>8.1f}  {cells[:-2]}{r['kv_copy_ms']:>10.1f}"
                     f"{r.get('rule_ms', 0.0):>8.1f}{r.get('plugin_excl_pct', 0.0):>6.1f}%"
                     f"{r['rest_ms']:>8.1f} {r['rest_pct']:>3.0f}%{r['rest_in_worker_ms']:>12.1f}")
    lines.append("ms per engine step (share of wall); kv copy, rule: parts of plugin py (dLLM "
                 "scratch_plan, decision rule's vocabulary math); excl.: plugin py without "
                 "them, share of wall; in worker: part of rest inside execute_model/sample_tokens")
    for r in results:  # where the plugin's Python goes (exclusive ms per step)
        fns = sorted(((v, k.split(": ", 1)[1]) for k, v in r["timers"]["by_function"].items()
                      if k.startswith(("plugin:", "kv_copy:", "rule:"))), reverse=True)[:4]
        if r["plugin_py_ms"] >= 0.5:
            lines.append(f"  plugin py, {r['method']} b{r['batch']}: " + ", ".join(
                f"{name} {1e3 * v / max(1, r['steps']):.1f}" for v, name in fns))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8],
                    help="requests submitted together (one timed pass each)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--block", type=int, default=32, help="dLLM block length")
    ap.add_argument("--cooldown", type=float, default=90.0,
                    help="seconds at most to wait for load average <= cores/2 before a row")
    ap.add_argument("--ignore-eos", action="store_true",
                    help="decode max_tokens whatever the output (default: stop at EOS, as the "
                         "scoreboard bench_all.py does, so the two can be compared)")
    ap.add_argument("--rows", nargs="+", default=[],
                    help="only rows whose name starts with one of these (e.g. no-spec assd ssd)")
    args = ap.parse_args()

    chosen = [c for c in rows(args.block)
              if not args.rows or any(c.name.startswith(s) for s in args.rows)]
    needs = lambda c: [c.model, *[m for m in [(c.speculative_config or {}).get("model")] if m]]  # noqa: E731
    skipped = [c.name for c in chosen if not all(Path(m).exists() for m in needs(c))]
    chosen = [c for c in chosen if c.name not in skipped]
    dtype, why = cpu_dtype()
    print(f"[breakdown] dtype {dtype}: {why}; {machine()}; {len(chosen)} rows x batch "
          f"{args.batch}; {args.prompts} prompts x {args.max_tokens} tokens, greedy"
          + (f"; skipped (models missing): {skipped}" if skipped else ""))
    results, runs = [], []
    for i, cfg in enumerate(chosen):
        waited = wait_quiet(args.cooldown)  # load average <= cores / 2 (the harness's rule)
        before = machine_info()
        t0 = time.perf_counter()
        got = run_in_child(measure, cfg, args.prompts, args.max_tokens, args.batch,
                           args.ignore_eos, name=cfg.name)
        runs.append(dict(method=cfg.name, model=str(Path(cfg.model).relative_to(REPO)),
                         speculative_config=cfg.speculative_config,
                         additional_config=cfg.additional_config, start_s=got["start_s"],
                         row_s=time.perf_counter() - t0, wrapped=got["wrapped"],
                         waited_s=round(waited, 1),
                         machine_before=before, machine_after=machine_info()))
        results += got["results"]
        print(f"[{i + 1}/{len(chosen)}] {cfg.name}: "
              + ", ".join(f"b{r['batch']} {r['ms_per_step']:.1f} ms/step x {r['steps']}"
                          for r in got["results"]) + f" ({runs[-1]['row_s']:.0f} s)")
    results.sort(key=lambda r: r["batch"])
    print("\n" + table(results))
    bad = [f"{r['method']} b{r['batch']}" for r in results if not r["adds_up"]]
    if bad:
        print(f"WARNING: items 1-3 exceed the wall clock in {bad}")
    out = REPO / "benchmarks" / "results" / f"breakdown-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(
        dtype=dtype, dtype_why=why, machine=machine_info(), prompts=args.prompts,
        max_tokens=args.max_tokens, batches=args.batch, dllm_block=args.block,
        categories=__doc__.split("\n\n")[1], rows=runs, results=results), indent=1))
    print(f"wrote {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
