"""The speculation budget (``"budget": "auto"``, the default) against no speculation and the
fixed settings of the same method, at several batch sizes, in one run (issue 22).

Rows per method: no speculation; the method with ``budget: fixed`` at a sweep of sizes;
``auto`` with the method's options left at their defaults (what a user gets with no option
given); ``auto`` at the sweep's largest size; and ``drafts off`` (``budget: cycle:0``: the
method's proposer running but drafting nothing: the floor of the controller's overhead). vLLM's
``ngram`` where it applies. The harness is the project's (``compare``: one engine alive at a
time, rows rotated across ``--repeats`` rounds, quiet-machine checks); every batch size in
``--batch`` is timed in each row-run.

    .venv/bin/python -m benchmarks.bench_budget --method jacobi [--batch 1 4 8 16]
        [--temperature 0.8] [--random-target]   # a random-weight twin: drafts ~never accepted

The figures on this CPU are in benchmarks/RESULTS.md; the repetition share of the
no-speculation output is printed with every table (the tiny targets loop).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import configs as C  # noqa: E402
from benchmarks.common import DEFAULT_MODEL, REPO, load_prompts  # noqa: E402
from benchmarks.compare import Config, compare  # noqa: E402

SWEEPS = {"jacobi": [4, 8, 16], "assd": [3, 5, 8], "specdiff": [4, 8]}
TARGETS = {"jacobi": DEFAULT_MODEL, "assd": C.ASARM, "specdiff": REPO / "models" / "ar-target-large"}


def _with_budget(row: Config, method: str, budget: str, label: str) -> Config:
    extra = dict((row.additional_config or {}).get("anyorder", {}).get(method, {}))
    row.additional_config = {"anyorder": {method: {**extra, "budget": budget}}}
    row.name = f"{row.name} {label}"
    row.family = f"{row.family} {label}"
    return row


def _row(method: str, size: int) -> Config:
    if method == "jacobi":
        return C.jacobi(size, 2)
    if method == "assd":
        return C.assd(size, "ngram")
    return C.specdiff(size, 1, C.MDLM_DISTILLED, window=56)


def _default_row(method: str) -> Config:
    """The method with no option but the ones it cannot do without: budget auto."""
    spec = {"method": method}
    if method == "specdiff":
        spec["model"] = str(C.MDLM_DISTILLED)
    ref = "no-spec (asarm)" if method == "assd" else ""
    return Config(f"{method} defaults (auto)", spec, family=f"{method} defaults", reference=ref)


def rows(method: str, sizes: list[int]) -> list[Config]:
    base = [Config("no-spec (asarm)", model=C.ASARM)] if method == "assd" else [C.no_spec()]
    if method == "jacobi":
        base.append(C.ngram(8))
    fixed = [_with_budget(_row(method, k), method, "fixed", "fixed") for k in sizes]
    auto = [_with_budget(_row(method, max(sizes)), method, "auto", "auto"), _default_row(method)]
    off = [_with_budget(_row(method, max(sizes)), method, "cycle:0", "drafts off")]
    return base + fixed + auto + off


def random_twin(model: Path) -> Path:
    """``model``'s architecture and tokenizer with random weights (drafts ~never accepted)."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = REPO / "benchmarks" / "results" / f"{model.name}-random"
    if (out / "config.json").exists():
        return out
    torch.manual_seed(0)
    net = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model))
    net.save_pretrained(out)
    for f in model.glob("tokenizer*"):
        shutil.copy(f, out / f.name)
    for f in model.glob("special_tokens_map.json"):
        shutil.copy(f, out / f.name)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", choices=sorted(SWEEPS), default="jacobi")
    ap.add_argument("--sizes", type=int, nargs="+", default=None)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--random-target", action="store_true",
                    help="a random-weight twin of the target (drafts almost never accepted)")
    ap.add_argument("--only", nargs="*", default=None, help="row names to keep (substrings)")
    args = ap.parse_args()

    from vllm import SamplingParams

    target = TARGETS[args.method]
    if args.random_target:
        target = random_twin(target)
    table = rows(args.method, args.sizes or SWEEPS[args.method])
    if args.method == "assd" and args.random_target:
        raise SystemExit("--random-target: AR targets only (jacobi, specdiff)")
    if args.only:
        table = [r for r in table if r is table[0] or any(s in r.name for s in args.only)]
    prompts = load_prompts(args.prompts)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens,
                            ignore_eos=True, seed=0 if args.temperature else None)
    result = compare(f"budget-{args.method}{'-random' if args.random_target else ''}", target,
                     table, prompts, params, repeats=args.repeats, batch=args.batch,
                     describe=f"model {target.name}; {len(prompts)} prompts x {args.max_tokens} "
                              f"tokens, T={args.temperature}")
    return 0 if result else 1


if __name__ == "__main__":
    sys.exit(main())
