"""Record a per-step acceptance trace for ``budget_replay.py``: one method at ``"budget":
"fixed"`` (its configured size every step), the benchmark prompts submitted at once, greedy.

    .venv/bin/python -m benchmarks.record_trace --method jacobi --n 16 --prompts 8 \\
        --tokens 64 --out benchmarks/results/traces/jacobi-n16
    .venv/bin/python -m benchmarks.record_trace --method ssd --n 4 --prompts 4 \\
        --tokens 64 --out benchmarks/results/traces/ssd-n4   # on models/llada-dllm

The worker appends one JSON line per engine step to ``<out>/trace-<pid>.jsonl`` (the plugin's
``VLLM_ANYORDER_BUDGET_TRACE``, ``vllm_anyorder/proposers/budget.py``); ``<out>/meta.json``
says what ran (method, sizes, model, prompt lengths: the replay's KV context) and where. The
accepted counts are the same on any machine (outputs are identical), the step seconds are
this machine's (the replay's ``measured`` profile fits them).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from benchmarks import configs
from benchmarks.common import (DEFAULT_MODEL, REPO, close, cpu_dtype, load_prompts,
                               machine_info, make_engine, timed_generate)

TRACE_ENV = "VLLM_ANYORDER_BUDGET_TRACE"  # read by the worker (proposers/budget.py)


def method_config(method: str, n: int, drafter: str | None):
    """(speculative_config, additional_config) of ``method`` at size ``n``, budget fixed."""
    if method == "jacobi":
        cfg = configs.jacobi(n)
    elif method == "specdiff":
        cfg = configs.specdiff(n, 1, **({"drafter": Path(drafter)} if drafter else {}))
    elif method == "assd":
        cfg = configs.assd(n, drafter or "self")
    elif method in ("ssd", "freedave"):  # N nodes / d look-ahead steps, bench_dllm's blocks
        cfg = configs.dllm(method, method, n)
        return cfg.speculative_config, cfg.additional_config, configs.LLADA
    else:
        raise SystemExit(f"--method: jacobi, specdiff, assd, ssd or freedave, not {method!r}")
    extra = json.loads(json.dumps(cfg.additional_config or {"anyorder": {method: {}}}))
    extra["anyorder"].setdefault(method, {})["budget"] = "fixed"
    return cfg.speculative_config, extra, cfg.model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="jacobi")
    ap.add_argument("--n", type=int, default=16, help="the method's size (num_speculative_tokens)")
    ap.add_argument("--drafter", help="specdiff drafter directory / assd drafter name")
    ap.add_argument("--model", help=f"target (default: the method's, {DEFAULT_MODEL.name})")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", required=True, help="directory for trace-<pid>.jsonl + meta.json")
    args = ap.parse_args()

    from vllm import SamplingParams

    spec, extra, model = method_config(args.method, args.n, args.drafter)
    model = Path(args.model) if args.model else (model or DEFAULT_MODEL)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ[TRACE_ENV] = str(out.resolve())
    prompts = load_prompts(args.prompts)
    llm = make_engine(model, spec, extra)
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    tokenizer = llm.get_tokenizer()
    run = timed_generate(llm, args.method, prompts, params, warmup=False)
    close(llm)
    meta = {"method": args.method, "speculative_config": spec, "additional_config": extra,
            "model": str(Path(model).resolve().relative_to(REPO)) if Path(model).resolve()
            .is_relative_to(REPO) else str(model),
            "prompts": len(prompts), "max_tokens": args.tokens, "greedy": True,
            "prompt_tokens": [len(tokenizer.encode(p)) for p in prompts],
            "dtype": cpu_dtype()[0], "machine": machine_info(),
            "generated": run.generated, "seconds": round(run.seconds, 3)}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"trace in {out}: {run.generated} tokens, {len(list(out.glob('trace-*.jsonl')))} "
          f"worker file(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
