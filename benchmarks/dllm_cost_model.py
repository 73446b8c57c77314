"""Why `ssd` / `freedave` are slower than `stepwise` on this CPU: a cost model checked against
the scoreboard.

    predicted ratio (method vs stepwise) = (F_stepwise / F_method) x (c_stepwise / c_method)

F = model forwards per run (vLLM's own forward of each committed block + the proposer's
denoising / verification forwards), read by the probe of the timed run (``bench_dllm.py``
or the scoreboard, ``bench_all.py``);
c = measured ms per model forward of that method, from the step breakdown
(``bench_breakdown.py``: its target + drafting forward time over their counts). A
verification forward evaluates N+1 (SSD), 2N (mix-order) or d (FreeDave) canvases over the
block and its look-ahead block, so c grows with the rows on a CPU whose matmuls are
compute-bound, and the forward-count saving is outweighed. The second column adds each
method's per-step rest (plugin Python, vLLM) from the breakdown, per engine step (the same
number of engine steps for all three: one block each).

Both inputs must come from the same code on the same machine and settings (``ignore_eos``
or not), one right after the other; the check of record (RESULTS.md):

    bench_dllm.py --n 4 --d 4                                   # timed, no timers
    bench_breakdown.py --batch 1 --ignore-eos --rows "stepwise (baseline)" "ssd N=4" "freedave d=4"
    .venv/bin/python benchmarks/dllm_cost_model.py BREAKDOWN.json TIMED.json [--batch 1]

``breakdown ratio`` is the breakdown run's own wall-clock ratio (with its timers), printed
to show how much the timers move the ratio.
"""

from __future__ import annotations

import argparse
import json
import sys

ROWS = ("ssd N=4", "freedave d=4")
BASE = "stepwise (baseline)"


def plain(method: str) -> str:
    """A row's method without the scoreboard's model and batch labels."""
    return method.split(" [batch")[0].removesuffix(" (llada)")


def forward_cost(r: dict) -> tuple[float, float]:
    """(ms per model forward, ms per engine step outside forwards) of a breakdown row."""
    forwards = r["target_forwards"] + r["draft_forwards"]
    fwd_ms = (r["target_fwd_ms"] + r["draft_fwd_ms"]) * r["steps"]
    return fwd_ms / max(1, forwards), r["plugin_py_ms"] + r["rest_ms"]


def predict(breakdown: dict, scoreboard: dict, batch: int) -> list[dict]:
    bd = {r["method"]: r for r in breakdown["results"] if r["batch"] == batch}
    sb = {plain(r["method"]): r for r in scoreboard["rows"] if (r.get("batch") or 1) == batch}
    c_base, o_base = forward_cost(bd[BASE])
    f_base = sb[BASE]["model_forwards"]
    steps = sb[BASE]["engine_forwards"]  # engine steps: one block each, for all three
    out = []
    for name in ROWS:
        if name not in bd or name not in sb:
            continue
        c, o = forward_cost(bd[name])
        f = sb[name]["model_forwards"]
        simple = (f_base * c_base) / (f * c)
        with_rest = (f_base * c_base + steps * o_base) / (f * c + steps * o)
        measured = sb[name]["speedup_vs_nospec"]
        out.append(dict(method=name, forwards=f, forwards_stepwise=f_base,
                        ms_per_forward=round(c, 2), ms_per_forward_stepwise=round(c_base, 2),
                        predicted=round(simple, 3), predicted_with_rest=round(with_rest, 3),
                        measured=round(measured, 3),
                        breakdown_ratio=round(bd[BASE]["wall_s"] / bd[name]["wall_s"], 3),
                        forwards_in_breakdown=bd[name]["target_forwards"]
                        + bd[name]["draft_forwards"],
                        error_pct=round(100 * (simple - measured) / measured, 1),
                        error_with_rest_pct=round(100 * (with_rest - measured) / measured, 1)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("breakdown")
    ap.add_argument("scoreboard")
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    rows = predict(json.load(open(args.breakdown)), json.load(open(args.scoreboard)), args.batch)
    print(f"{'method':<14}{'F':>6}{'F step':>8}{'c ms':>7}{'c step':>8}{'pred':>7}"
          f"{'+rest':>7}{'measured':>10}{'err':>7}{'err+rest':>9}{'breakdown ratio':>16}")
    for r in rows:
        print(f"{r['method']:<14}{r['forwards']:>6}{r['forwards_stepwise']:>8}"
              f"{r['ms_per_forward']:>7.2f}{r['ms_per_forward_stepwise']:>8.2f}"
              f"{r['predicted']:>6.2f}x{r['predicted_with_rest']:>6.2f}x{r['measured']:>9.2f}x"
              f"{r['error_pct']:>6.1f}%{r['error_with_rest_pct']:>8.1f}%"
              f"{r['breakdown_ratio']:>15.2f}x")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
