"""Benchmark `jacobi` against vLLM without speculation and vLLM's built-in `ngram`.

Same prompts, same engine settings (bf16, the realistic CPU setting), engines warmed up,
``--repeats`` interleaved rounds; reports min/median wall-clock, tokens per target forward,
acceptance-length histogram by position, and exact match against the no-speculation greedy
output. Writes benchmarks/results/jacobi-<timestamp>.json.

    .venv/bin/python benchmarks/bench_jacobi.py [--model DIR] [--prompts 8] [--blocks 8 16]
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import DEFAULT_MODEL, REPO, close, load_prompts, machine, make_engine, timed_generate  # noqa: E402


def configs(blocks, k_blocks):
    yield "no-spec", None, None
    yield "ngram k=8", {"method": "ngram", "num_speculative_tokens": 8,
                        "prompt_lookup_max": 3, "prompt_lookup_min": 1}, None
    for n in blocks:
        yield (f"jacobi n={n} K={k_blocks}", {"method": "jacobi", "num_speculative_tokens": n},
               {"anyorder": {"jacobi": {"num_blocks": k_blocks}}})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--blocks", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--num-blocks", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=0, help="requests submitted together (0 = all)")
    args = ap.parse_args()

    from tqdm import tqdm
    from vllm import SamplingParams

    prompts = load_prompts(args.prompts)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    cfgs = list(configs(args.blocks, args.num_blocks))
    # vLLM keeps one Prometheus registry per process and a new engine unregisters the
    # previous one's metrics, so each engine's acceptance counters are read right after it
    # starts (warm-up + one measured pass); the timing rounds then run interleaved.
    engines, first = {}, {}
    for name, spec, extra in tqdm(cfgs, desc="engines (start + acceptance pass)"):
        engines[name] = make_engine(args.model, spec, extra)
        first[name] = timed_generate(engines[name], name, prompts, params, warmup=True, batch=args.batch)
    seconds = {name: [] for name in engines}
    for _ in tqdm(range(args.repeats), desc="timing rounds"):
        for name, llm in engines.items():  # interleaved: each round runs every method once
            seconds[name].append(timed_generate(llm, name, prompts, params, warmup=False,
                                                batch=args.batch).seconds)
    for llm in engines.values():
        close(llm)

    ref = first["no-spec"].outputs
    base_med = statistics.median(seconds["no-spec"])
    rows = []
    for name, run in first.items():
        med = statistics.median(seconds[name])
        rows.append(dict(
            method=name, seconds_min=min(seconds[name]), seconds_median=med,
            tokens_per_s=run.generated / med, speedup_vs_nospec=base_med / med,
            tokens_per_target_forward=run.mean_acceptance_length,
            accepted_per_position=run.accepted_per_pos, target_forwards_with_drafts=run.drafts,
            exact_match=sum(a == b for a, b in zip(run.outputs, ref)) / len(ref)))
    print(f"\nmachine: {machine()}; model {args.model.name}; {len(prompts)} prompts x "
          f"{args.max_tokens} tokens (batch {args.batch or 'all'}), greedy, bf16, "
          f"{args.repeats} interleaved rounds")
    print(f"{'method':<22}{'tok/fwd':>8}{'median s':>10}{'min s':>8}{'speedup':>9}{'exact':>7}")
    for r in rows:
        print(f"{r['method']:<22}{r['tokens_per_target_forward']:>8.2f}{r['seconds_median']:>10.2f}"
              f"{r['seconds_min']:>8.2f}{r['speedup_vs_nospec']:>8.2f}x{r['exact_match']:>7.0%}")
    for r in rows:
        if r["accepted_per_position"]:
            print(f"  accepted by position, {r['method']}: {r['accepted_per_position'][:20]}")
    out = REPO / "benchmarks" / "results" / f"jacobi-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(machine=machine(), args={k: str(v) for k, v in vars(args).items()},
                                   rows=rows), indent=1))
    print(f"wrote {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
