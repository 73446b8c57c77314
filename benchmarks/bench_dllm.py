"""Benchmark the diffusion-LLM decoding policies in vLLM on `models/llada-dllm`: the static
stepwise baseline (what the model gets without a speculative config), `ssd` at N = 3..5 (greedy
chain and mix-order) and `freedave` at d = 2..8, same prompts, same block length and steps.

Reports per configuration: model forwards per generated token (vLLM's own forward, which
writes each committed block's K/V, plus the proposer's denoising / verification forwards,
read from the model's counters; one request at a time, so a batched forward counts once for
one request), engine steps per token, min/median wall clock over rounds (one engine alive at a time), the
ratio to the baseline, exact match against the baseline's output (the lossless reference).

    .venv/bin/python benchmarks/bench_dllm.py [--block 32] [--prompts 8] [--max-tokens 128]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import load_prompts  # noqa: E402
from benchmarks.compare import Config, compare  # noqa: E402
from benchmarks.configs import DLLM_BLOCK, LLADA, dllm  # noqa: E402

def configs(block: int, steps: int, ns: list[int], ds: list[int],
            budgets: tuple[str, ...] = ("fixed",), mix: bool = True) -> list[Config]:
    """``budgets``: each ssd / freedave row once per speculation budget (``fixed``: N / d
    every round; ``auto``: the controller's choice per round, N / d the maximum)."""
    def row(name, method, k=0, budget="fixed", **extra):
        return dllm(name, method, k, budget, block, steps, **extra)

    rows = [row("stepwise (baseline)", "stepwise")]
    for b in budgets:
        rows += [row(f"ssd N={n}", "ssd", n, b) for n in ns]
        rows += [row(f"ssd-mix N={n}", "ssd", n, b, mix_order=True) for n in ns[-1:] if mix]
        rows += [row(f"freedave d={d}", "freedave", d, b) for d in ds]
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=LLADA)
    ap.add_argument("--block", type=int, default=DLLM_BLOCK)
    ap.add_argument("--steps", type=int, default=0, help="steps per block (0 = block length)")
    ap.add_argument("--n", type=int, nargs="+", default=[3, 4, 5])
    ap.add_argument("--d", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", nargs="+", default=["fixed"], choices=["fixed", "auto"],
                    help="speculation budget of the ssd / freedave rows (each row per budget)")
    ap.add_argument("--no-mix", action="store_true", help="leave out the ssd-mix row")
    ap.add_argument("--batch", type=int, nargs="+", default=[1],
                    help="requests submitted together; several: each timed per row-run")
    args = ap.parse_args()

    from vllm import SamplingParams

    prompts = load_prompts(args.prompts)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    table = configs(args.block, args.steps, args.n, args.d, tuple(args.budget), not args.no_mix)
    rows = compare("dllm", args.model, table, prompts,
                   params, repeats=args.repeats, batch=args.batch,
                   describe=f"dLLM {args.model.name}; block {args.block}, "
                            f"{args.steps or args.block} steps/block; {len(prompts)} prompts x "
                            f"{args.max_tokens} tokens, batch {args.batch}, greedy")
    base = rows[0]
    print(f"\n{'method':<24}{'fwd/token':>10}{'steps/token':>12}{'fewer forwards':>16}")
    for r in rows[: len(table)]:  # the first batch setting's rows
        generated = r["tokens_per_s"] * r["seconds_median"]
        fpt = r["model_forwards"] / generated
        print(f"{r['method']:<24}{fpt:>10.3f}{r['engine_forwards'] / generated:>12.3f}"
              f"{1 - r['model_forwards'] / base['model_forwards']:>15.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
