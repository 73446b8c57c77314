"""Benchmark `assd` (self-drafting and context-bigram drafting) on the AS-ARM `models/asarm`
against the same AS-ARM served without speculation (its sequential greedy reference).

Reports per configuration: tokens per target forward (vLLM's counters: verification steps),
tokens per model forward counting the self-drafting query-stream forwards, acceptance by
position, min/median wall clock over interleaved rounds, speed-up vs no speculation, exact
match vs the no-speculation greedy output.

    .venv/bin/python benchmarks/bench_assd.py [--k 3 5] [--batch 1]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import configs as C  # noqa: E402
from benchmarks.common import load_prompts  # noqa: E402
from benchmarks.compare import Config, compare  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=C.ASARM)
    ap.add_argument("--k", type=int, nargs="+", default=[3, 5])
    ap.add_argument("--drafters", nargs="+", default=["self", "ngram"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1, help="requests submitted together (0 = all)")
    args = ap.parse_args()

    from vllm import SamplingParams

    rows = [Config("no-spec (asarm)", model=args.model)]
    rows += [C.assd(k, d, args.model) for d in args.drafters for k in args.k]
    prompts = load_prompts(args.prompts)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    compare("assd", args.model, rows, prompts, params, repeats=args.repeats, batch=args.batch,
            describe=f"AS-ARM {args.model.name}; {len(prompts)} prompts x {args.max_tokens} "
                     f"tokens (batch {args.batch or 'all'}), greedy, bf16")
    return 0


if __name__ == "__main__":
    sys.exit(main())
