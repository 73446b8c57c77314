"""Benchmark `specdiff` (masked-diffusion drafter) against vLLM without speculation and vLLM's
`draft_model` with an autoregressive drafter of comparable size, on the same target/prompts.

Reports per configuration: tokens per target forward, acceptance by position, drafter cost
per engine step (ms, measured inside the worker), min/median wall clock over rounds (one
engine alive at a time), speed-up vs no speculation, exact match vs the no-speculation greedy output.

    .venv/bin/python benchmarks/bench_specdiff.py [--grid 8:2 8:4 16:4 8:1:56] [--batch 1]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import configs as C  # noqa: E402
from benchmarks.common import DEFAULT_MODEL, load_prompts  # noqa: E402
from benchmarks.compare import compare  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--drafter", type=Path, default=C.MDLM_DRAFTER)
    ap.add_argument("--ar-drafter", type=Path, default=C.AR_DRAFTER)
    ap.add_argument("--grid", nargs="+", default=["8:2", "8:4", "16:4", "16:8"],
                    help="specdiff gamma:T or gamma:T:W (W: drafter context window)")
    ap.add_argument("--ar-k", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1, help="requests submitted together (0 = all)")
    args = ap.parse_args()

    from vllm import SamplingParams

    grid = [tuple(int(x) for x in pair.split(":")) for pair in args.grid]
    rows = [C.no_spec()] + [C.draft_model(k, args.ar_drafter) for k in args.ar_k]
    rows += [C.specdiff(g[0], g[1], args.drafter, window=g[2] if len(g) > 2 else 0) for g in grid]
    prompts = load_prompts(args.prompts)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    compare("specdiff", args.model, rows, prompts, params, repeats=args.repeats, batch=args.batch,
            describe=f"target {args.model.name}, drafters {args.drafter.name} / "
                     f"{args.ar_drafter.name}; {len(prompts)} prompts x {args.max_tokens} tokens "
                     f"(batch {args.batch or 'all'}), greedy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
