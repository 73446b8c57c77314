"""Demo: the same prompts through vLLM with and without `jacobi` on the embedded model.

`jacobi` runs as a user gets it: the speculation budget ``auto`` (the default) chooses each
step how many of the block's drafts are worth verifying on this machine.

Prints whether the outputs are identical, tokens per target forward and the wall-clock ratio
(median of ``--rounds`` rounds, min-max), with the dtype and the machine. Default model:
models/ar-target (4.5M-param Llama trained on the Python stdlib, committed in the repository;
nothing is downloaded). The dtype is chosen by the CPU: bf16 where it multiplies bf16 natively
(AVX512_BF16 / AMX), fp32 elsewhere (``ANYORDER_DTYPE`` overrides). Timing follows the
benchmarks' harness (benchmarks/compare.py): one engine alive at a time, each row-run in its own
process, rounds cycling through both rows, a load-average cooldown before each row-run.

    python examples/jacobi_demo.py [--model DIR] [--block 16] [--prompts 8] [--max-tokens 128]
"""

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # the demo prints its own summary

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import configs as C  # noqa: E402
from benchmarks.common import DEFAULT_MODEL, cpu_dtype, load_prompts  # noqa: E402
from benchmarks.compare import compare  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--block", type=int, default=16, help="num_speculative_tokens (block size n)")
    ap.add_argument("--blocks", type=int, default=2, help="blocks in flight K")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds (median, min-max)")
    ap.add_argument("--cooldown", type=float, default=60.0,
                    help="seconds at most to wait for load average <= cores/2 before a row-run")
    ap.add_argument("--batch", type=int, default=1,
                    help="requests submitted together (1 = one at a time, the latency setting; 0 = all)")
    args = ap.parse_args()

    from vllm import SamplingParams

    prompts = load_prompts(args.prompts)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    dtype, why = cpu_dtype()
    print(f"[demo] model {args.model}, {len(prompts)} prompts (batch {args.batch or 'all'}), "
          f"greedy, max_tokens={args.max_tokens}, dtype {dtype} ({why})")
    base, jac = compare("demo", args.model, [C.no_spec(), C.jacobi(args.block, args.blocks)],
                        prompts, params, repeats=args.rounds, batch=args.batch, plots=False,
                        cooldown_s=args.cooldown, write=False,
                        describe=f"{len(prompts)} prompts x {args.max_tokens} tokens")
    same = jac["exact_match"] == 1.0
    lo, hi = jac["speedup_min_max"]
    print()
    print(f"outputs identical to vLLM without speculation: {same} "
          f"({round(jac['exact_match'] * len(prompts))}/{len(prompts)} prompts, every round)")
    print(f"tokens per target forward (jacobi, mean acceptance length): "
          f"{jac['tokens_per_target_forward']:.2f}")
    print(f"wall clock (median of {args.rounds}): no-spec {base['seconds_median']:.2f} s, "
          f"jacobi (budget auto) "
          f"{jac['seconds_median']:.2f} s, ratio {jac['speedup_vs_nospec']:.2f}x "
          f"(per round {lo:.2f}-{hi:.2f}x); dtype {jac['dtype']}; quiet machine: "
          f"{base['all_rounds_quiet'] and jac['all_rounds_quiet']}")
    print("\nfirst completion:\n" + "-" * 60)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(args.model))
    print(prompts[0] + tok.decode(jac["first_output"]))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
