"""Every AR method on the larger target (models/ar-target-large, 22.5M parameters), against
vLLM without speculation and vLLM's built-in `ngram` and `draft_model` on the same prompts.

Why a larger target: models/ar-target (4.5M) costs ~1 ms per forward, far below vLLM's CPU
engine overhead per step (~5-8 ms), so every method's gain is capped by engine overhead and
the specdiff / draft_model drafters cost about as much as the target. Here the target forward
dominates a step and the drafters (models/ar-drafter, models/mdlm-drafter, unchanged) are
several times cheaper than it. Rows: no-spec; ngram k; draft_model k (AR drafter); jacobi n=k
K=2; specdiff gamma=k T=k/4 (masked-diffusion drafter, and its version distilled from this
target, models/mdlm-drafter-distilled, when it exists); and, when the Jacobi-distilled large
target exists (models/ar-target-large-jacobi, see training/README.md), its own no-spec and
jacobi n=16 rows. One engine alive at a time (benchmarks/compare.py), greedy, dtype by CPU.

    LD_PRELOAD=$PWD/.venv/lib/libiomp5.so .venv/bin/python benchmarks/bench_large.py \
        [--k 8] [--batch 1 8] [--prompts 8] [--max-tokens 128] [--repeats 3]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import configs as C  # noqa: E402
from benchmarks.common import REPO, load_prompts  # noqa: E402
from benchmarks.compare import Config, compare  # noqa: E402

LARGE = REPO / "models" / "ar-target-large"
LARGE_DISTILLED = REPO / "models" / "ar-target-large-jacobi"


def rows(k: int) -> list[Config]:
    out = [C.no_spec(), C.ngram(k), C.draft_model(k), C.jacobi(k),
           C.specdiff(k, max(1, k // 4))]
    if C.MDLM_DISTILLED.exists():
        out.append(C.specdiff(k, max(1, k // 4), C.MDLM_DISTILLED, label=" distilled drafter"))
    if LARGE_DISTILLED.exists():
        out.append(Config("no-spec (distilled)", model=LARGE_DISTILLED))
        out.append(Config(**{**vars(C.jacobi(16, model=LARGE_DISTILLED, label=" distilled")),
                             "reference": "no-spec (distilled)"}))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=LARGE)
    ap.add_argument("--k", type=int, default=8, help="drafts per step of every method")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--cooldown", type=float, default=90.0)
    args = ap.parse_args()
    if not args.model.exists():
        print(f"{args.model} does not exist: train it first (training/README.md)")
        return 1

    from vllm import SamplingParams

    prompts = load_prompts(args.prompts)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    compare("large", args.model, rows(args.k), prompts, params, repeats=args.repeats,
            batch=args.batch, cooldown_s=args.cooldown,
            describe=f"target {args.model.name}; {len(prompts)} prompts x {args.max_tokens} "
                     f"tokens (batch {', '.join(str(b or 'all') for b in args.batch)}), greedy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
