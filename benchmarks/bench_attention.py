"""The two attention implementations of the plugin's models, side by side on this CPU:
vLLM's CPU op (``VLLM_ANYORDER_ATTENTION=cpu_op``) and the plugin's PyTorch one (``torch``),
so that ``auto`` (``attention_backends/selection.py``, ``AUTO_ON_CPU``) is chosen by
measurement. Rows (one engine alive at a time, the harness of ``compare.py``):

* dLLM ``models/llada-dllm``: ``stepwise``, ``ssd`` N=4, ``freedave`` d=4 on each
  implementation (the torch rows' node forwards read the prefix from the paged cache; the
  CPU op's copy it into scratch blocks);
* AS-ARM ``models/asarm``: no speculation and ``assd`` (ngram drafter, k=5) on each.

Each row's exact-match column compares it with the same family's baseline on the SAME
implementation (the lossless guarantee is per engine); ``--ratios`` prints torch / cpu_op
per method.

    .venv/bin/python benchmarks/bench_attention.py [--prompts 8] [--max-tokens 64] [--batch 1 8]
"""

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import load_prompts  # noqa: E402
from benchmarks.compare import Config, assd_probe, compare  # noqa: E402
from benchmarks.configs import ASARM, LLADA, dllm  # noqa: E402

IMPLS = ("cpu_op", "torch")


def configs(block: int, k: int) -> list[Config]:
    rows = []
    for impl in IMPLS:
        env, tag = {"VLLM_ANYORDER_ATTENTION": impl}, f"[{impl}]"
        base = f"stepwise {tag}"
        for name, method, n in (("stepwise", "stepwise", 0), ("ssd N=4", "ssd", 4),
                                ("freedave d=4", "freedave", 4)):
            cfg = dllm(name, method, n, "fixed", block, block)  # N / d every round
            rows.append(replace(cfg, name=f"{name} {tag}", model=LLADA, family=f"dllm {impl}",
                                reference=base, env=env))
        base = f"asarm no-spec {tag}"
        rows.append(Config(base, model=ASARM, family=f"asarm {impl}", reference=base, env=env))
        rows.append(Config(f"assd ngram k={k} {tag}", {"method": "assd",
                                                       "num_speculative_tokens": k},
                           {"anyorder": {"assd": {"drafter": "ngram"}}}, model=ASARM,
                           probe=assd_probe, family=f"asarm {impl}", k=k, reference=base,
                           env=env))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from vllm import SamplingParams

    prompts = load_prompts(args.prompts)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    rows = compare("attention", LLADA, configs(args.block, args.k), prompts, params,
                   repeats=args.repeats, batch=args.batch, plots=False,
                   describe=f"attention implementations; {len(prompts)} prompts x "
                            f"{args.max_tokens} tokens, batch {args.batch}, greedy")
    by_name = {r["method"]: r for r in rows}
    print(f"\n{'method':<36}{'torch / cpu_op (median s)':>28}")
    for name, r in by_name.items():
        other = by_name.get(name.replace("[torch]", "[cpu_op]"))
        if "[torch]" in name and other:
            print(f"{name:<36}{r['seconds_median'] / other['seconds_median']:>28.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
