"""Demo: the same prompts through vLLM with and without `jacobi` on the embedded model.

Prints whether the outputs are identical, tokens per target forward and the wall-clock
ratio. Default model: models/ar-target (4.5M-param Llama trained on the Python stdlib,
committed in the repository; nothing is downloaded).

    python examples/jacobi_demo.py [--model DIR] [--block 16] [--prompts 8] [--max-tokens 128]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import DEFAULT_MODEL, close, load_prompts, machine, make_engine, timed_generate  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--block", type=int, default=16, help="num_speculative_tokens (block size n)")
    ap.add_argument("--blocks", type=int, default=2, help="blocks in flight K")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1,
                    help="requests submitted together (1 = one at a time, the latency setting; 0 = all)")
    args = ap.parse_args()

    from vllm import SamplingParams

    prompts = load_prompts(args.prompts)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    print(f"[demo] model {args.model}, {len(prompts)} prompts (batch {args.batch or 'all'}), "
          f"greedy, max_tokens={args.max_tokens}")

    llm = make_engine(args.model)
    base = timed_generate(llm, "no speculation", prompts, params, batch=args.batch)
    close(llm)
    spec = {"method": "jacobi", "num_speculative_tokens": args.block}
    llm = make_engine(args.model, spec, {"anyorder": {"jacobi": {"num_blocks": args.blocks}}})
    jac = timed_generate(llm, "jacobi", prompts, params, batch=args.batch)
    close(llm)

    same = jac.outputs == base.outputs
    print()
    print(f"outputs identical to vLLM without speculation: {same} "
          f"({sum(a == b for a, b in zip(jac.outputs, base.outputs))}/{len(prompts)} prompts)")
    print(f"tokens per target forward (jacobi, mean acceptance length): {jac.mean_acceptance_length:.2f}")
    print(f"wall clock: no-spec {base.seconds:.2f} s, jacobi {jac.seconds:.2f} s, "
          f"ratio {base.seconds / jac.seconds:.2f}x  [{machine()}]")
    print("\nfirst completion:\n" + "-" * 60)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(args.model))
    print(prompts[0] + tok.decode(jac.outputs[0]))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
