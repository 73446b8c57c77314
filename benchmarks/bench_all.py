"""The project's one scoreboard: every method it has against vLLM's baselines, same target,
same benchmark prompts, side by side in one run (one engine alive at a time, warmed up, rounds
cycling through the rows, median and min/max; benchmarks/compare.py), on the committed models,
in the dtype the CPU multiplies fastest (benchmarks.common.cpu_dtype).

Rows: no speculation; vLLM's `ngram` and `draft_model` (AR drafter); `jacobi` (on the base
target, and on the Jacobi-distilled target against that target's own no-speculation run when
models/ar-target-jacobi exists); `specdiff` (masked-diffusion drafter); `assd` (self and
n-gram drafts) on the AS-ARM models/asarm against that model's own no-speculation run (its
rows also report tokens per model forward counting the drafting forwards); the diffusion LLM
models/llada-dllm decoded by `stepwise` (its baseline), `ssd` and `freedave` (against that
baseline; model forwards per token from the model's counters). Methods whose
models are not in models/ are listed as skipped. Prints a table, writes JSON + PNG plots (speed-up vs
k, acceptance by position) to benchmarks/results/.

Every row-run starts its engine in a child process and shuts it down before the next one
(a full run: rows x rounds engine starts, ~1 min each with the load-average cooldown).

    .venv/bin/python benchmarks/bench_all.py [--batch 1 8] [--prompts 8] [--quick] [--cooldown 90]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import configs as C  # noqa: E402
from benchmarks.common import DEFAULT_MODEL, REPO, load_prompts  # noqa: E402
from benchmarks.compare import Config, compare  # noqa: E402

DISTILLED = REPO / "models" / "ar-target-jacobi"
from benchmarks.bench_dllm import configs as dllm_configs  # noqa: E402
from benchmarks.configs import LLADA  # noqa: E402


def scoreboard(ks: list[int], quick: bool) -> tuple[list[Config], list[str]]:
    rows, skipped = [C.no_spec()], []
    rows += [C.ngram(k) for k in ks]
    rows += [C.draft_model(k) for k in ks] if C.AR_DRAFTER.exists() else []
    rows += [C.jacobi(n) for n in (ks if quick else sorted({8, 16, *ks}))]  # ngram's k too
    if DISTILLED.exists():
        rows.append(Config("no-spec (distilled)", model=DISTILLED))
        rows += [Config(**{**vars(C.jacobi(16, model=DISTILLED, label=" distilled")),
                           "reference": "no-spec (distilled)"})]
    else:
        skipped.append("jacobi on the distilled target: models/ar-target-jacobi not trained yet")
    if C.MDLM_DRAFTER.exists():
        rows += [C.specdiff(k, max(1, k // 4)) for k in ks]
    else:
        skipped.append("specdiff: models/mdlm-drafter not trained yet")
    if C.ASARM.exists():  # its own reference: the same AS-ARM served without speculation
        rows.append(Config("no-spec (asarm)", model=C.ASARM))
        rows += [C.assd(k, drafter) for drafter in ("self", "ngram")
                 for k in ([5] if quick else [3, 5])]
    else:
        skipped.append("assd: models/asarm not trained yet")
    if LLADA.exists():  # dLLM rows, against the same dLLM's stepwise baseline
        dllm = dllm_configs(C.DLLM_BLOCK, 0, [4] if quick else [3, 5], [4] if quick else [2, 8])
        for cfg in dllm:
            cfg.model = LLADA
            cfg.name = f"{cfg.name} (llada)"
            cfg.reference = dllm[0].name
        rows += dllm
    else:
        skipped.append("stepwise, ssd, freedave: models/llada-dllm not trained yet")
    return rows, skipped


def only(rows: list[Config], prefixes: list[str]) -> list[Config]:
    """The rows named by ``prefixes`` and their references, in scoreboard order (the first
    row, no-spec, stays first: it is the default reference)."""
    keep = {c.name for c in rows if any(c.name.startswith(p) for p in prefixes)}
    keep |= {c.reference or rows[0].name for c in rows if c.name in keep}
    return [c for c in rows if c.name in keep]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--k", type=int, nargs="+", default=[4, 8, 16], help="drafts per step swept")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, nargs="+", default=[1],
                    help="requests submitted together (0 = all); several: each timed in every "
                         "row-run with the same engine")
    ap.add_argument("--quick", action="store_true",
                    help="one k per method (the last --k; assd k=5, ssd N=4, freedave d=4)")
    ap.add_argument("--cooldown", type=float, default=90.0,
                    help="seconds at most to wait for load average <= cores/2 before a row-run")
    ap.add_argument("--rows", nargs="+", default=[],
                    help="only rows whose name starts with one of these, plus the rows they "
                         "are compared with (e.g. --k 4 16 --rows ngram draft_model assd)")
    args = ap.parse_args()

    from vllm import SamplingParams

    ks = args.k[-1:] if args.quick else sorted(args.k)
    rows, skipped = scoreboard(ks, args.quick)
    if args.rows:
        rows = only(rows, args.rows)
    for line in skipped:
        print(f"skipped: {line}")
    prompts = load_prompts(args.prompts)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    compare("all", args.model, rows, prompts, params, repeats=args.repeats, batch=args.batch,
            cooldown_s=args.cooldown,
            describe=f"target {args.model.name}; {len(prompts)} prompts x {args.max_tokens} tokens "
                     f"(batch {', '.join(str(b or 'all') for b in args.batch)}), greedy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
