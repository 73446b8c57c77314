"""Benchmark `jacobi` against vLLM without speculation and vLLM's built-in `ngram`.

Same prompts, same engine settings (dtype by the CPU: benchmarks.common.cpu_dtype), one engine
alive at a time, ``--repeats`` rounds cycling through the rows; reports min/median wall-clock, tokens per target forward,
acceptance-length histogram by position, and exact match against the no-speculation greedy
output. Writes benchmarks/results/jacobi-<timestamp>.json.

    .venv/bin/python benchmarks/bench_jacobi.py [--model DIR] [--prompts 8] [--blocks 8 16]
        [--base-model DIR]   # a distilled --model: also its base model's no-spec and jacobi rows
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import configs as C  # noqa: E402
from benchmarks.common import DEFAULT_MODEL, load_prompts  # noqa: E402
from benchmarks.compare import Config, compare  # noqa: E402


def configs(blocks, k_blocks, step_drafts=(0,), ngram_ks=(8,)):
    return [C.no_spec()] + [C.ngram(k) for k in ngram_ks] + [
        C.jacobi(n, k_blocks, step_drafts=s) for n in blocks for s in step_drafts]


def base_rows(base: Path, blocks, k_blocks) -> list[Config]:
    """The base model of a distilled target, each jacobi row compared with its own no-spec
    (different models: the ratios, not the outputs, are comparable)."""
    rows = [Config("no-spec (base)", model=base)]
    for n in blocks:
        row = C.jacobi(n, k_blocks, model=base, label=" (base)")
        row.reference = "no-spec (base)"
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--blocks", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--num-blocks", type=int, default=2)
    ap.add_argument("--step-drafts", type=int, nargs="+", default=[0],
                    help="jacobi.step_drafts values (0 = no limit)")
    ap.add_argument("--ngram-k", type=int, nargs="+", default=[8],
                    help="vLLM ngram rows: num_speculative_tokens of each")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, nargs="+", default=[0],
                    help="requests submitted together (0 = all); several: each timed per row-run")
    ap.add_argument("--base-model", type=Path, default=None,
                    help="also time this model (the distilled --model's base) without "
                         "speculation and with jacobi (no step_drafts)")
    args = ap.parse_args()

    from vllm import SamplingParams

    prompts = load_prompts(args.prompts)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    rows = configs(args.blocks, args.num_blocks, args.step_drafts, args.ngram_k)
    if args.base_model:
        rows += base_rows(args.base_model, args.blocks, args.num_blocks)
    compare("jacobi", args.model, rows, prompts, params,
            repeats=args.repeats, batch=args.batch,
            describe=f"model {args.model.name}"
                     + (f" (base rows: {args.base_model.name})" if args.base_model else "")
                     + f"; {len(prompts)} prompts x {args.max_tokens} tokens "
                     f"(batch {', '.join(str(b or 'all') for b in args.batch)}), greedy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
