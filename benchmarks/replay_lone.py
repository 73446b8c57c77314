"""Replay one fixed size's recorded acceptance through ``auto`` at batch 1: requests one after
another, as ``bench_switch --batch 1`` runs them (issue 22; ``budget_replay.py`` replays a
recorded batch instead).

    # 1. record: a fixed size beside auto on one engine, with the budget trace on
    VLLM_ANYORDER_BUDGET_TRACE=/tmp/tr .venv/bin/python -m benchmarks.bench_switch \\
        --interleave --method specdiff --batch 1 --prompts 16 --modes auto cycle:4
    # 2. extract each request's accepted drafts per step at that size, and the step prices
    .venv/bin/python -m benchmarks.replay_lone --extract /tmp/tr/trace-*.jsonl --k 4 \\
        --out benchmarks/results/traces/specdiff-b1-k4.json
    # 3. replay: auto against the fixed size and plain decoding, pass by pass, a few seeds
    .venv/bin/python -m benchmarks.replay_lone benchmarks/results/traces/specdiff-b1-k4.json

THE APPROXIMATION: at token position n of a request, a drafting step of c drafts accepts
min(A, c), A the drafts the fixed size accepted in its step that began nearest below n
(beyond the recorded size, each further draft with probability ``--beyond``); a step costs
the recorded median of plain steps (``auto``'s among them: the fixed size runs few) or of
steps drafting that many (the nearest count recorded),
times 1-1.04 (noise). Before the first request, ``--batch2`` plain steps of two requests
price a plain row (an engine's warm-up does the same). Outputs: time per pass, and auto /
fixed by pass. Simulated seconds, never a measurement.
"""

from __future__ import annotations

import argparse
import bisect
import json
import random
import statistics
from collections import OrderedDict, defaultdict
from pathlib import Path


def extract(paths: list[str], k: int) -> dict:
    streams: OrderedDict[str, list[int]] = OrderedDict()
    seconds: dict[int, list[float]] = defaultdict(list)
    for path in paths:
        for line in open(path):
            step = json.loads(line)
            if not step["clean"] or step["seconds"] <= 0:
                continue
            fixed = step.get("mode") == "cycle"
            for req_id, drafted, accepted in step["requests"]:
                if len(step["requests"]) == 1 and (fixed or not drafted):
                    seconds[drafted].append(step["seconds"])  # plain: auto's plain steps too
                if fixed and drafted == k:
                    streams.setdefault(req_id, []).append(accepted)
    whole = [s for s in streams.values() if len(s) >= 8]  # not a request's last few steps
    prices = {d: statistics.median(v) for d, v in seconds.items() if len(v) >= 5}
    return {"k": k, "streams": whole, "seconds": prices}


def accepted_at(stream: list[int], position: int) -> int:
    starts = [0]
    for a in stream:
        starts.append(starts[-1] + 1 + a)
    return stream[min(bisect.bisect_right(starts, position) - 1, len(stream) - 1)]


def replay(data: dict, mode: str, seed: int, passes: int, tokens: int, most: int,
           beyond: float, batch2: int) -> list[float]:
    from vllm_anyorder.core.budget import BudgetController
    from vllm_anyorder.core.budget_settings import BudgetSettings

    rng = random.Random(seed)
    prices = {int(d): s for d, s in data["seconds"].items()}
    k = data["k"]

    def cost(drafts: int) -> float:  # a drafting step is priced by drafting steps only
        recorded = [d for d in prices if (d > 0) == (drafts > 0)] or list(prices)
        near = min(recorded, key=lambda d: (abs(d - drafts), d))
        return prices[near] * (1 + 0.04 * rng.random())

    ctl = BudgetController(BudgetSettings(max_drafts=most, mode=mode), lambda depth: 1)
    for _ in range(batch2):
        ctl.allot(["a", "b"], [0, 0])
        ctl.record_step(2, False, 1.3 * cost(0), 2, 2)
    out = []
    for p in range(passes):
        elapsed = 0.0
        for r, stream in enumerate(data["streams"]):
            req_id, made = f"p{p}r{r}", 0
            while made < tokens:
                c = ctl.allot([req_id], [min(most, tokens - made - 1)])[0]
                a = 0
                if c:
                    a = min(accepted_at(stream, made), c)
                    while a == k and a < c and rng.random() < beyond:
                        a += 1
                    ctl.record_verified(req_id, c, a)
                step = cost(c)
                ctl.record_step(1 + c, bool(c), step, 1, 1 + a)
                elapsed, made = elapsed + step, made + 1 + a
        out.append(elapsed)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", nargs="*")
    ap.add_argument("--extract", nargs="+")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--max-drafts", type=int, default=8)
    ap.add_argument("--beyond", type=float, default=0.45)
    ap.add_argument("--batch2", type=int, default=20)
    ap.add_argument("--requests", type=int, default=16, help="the first N recorded requests "
                    "(a recording of several rounds holds each prompt once a round)")
    args = ap.parse_args()
    if args.extract:
        data = extract(args.extract, args.k)
        args.out.write_text(json.dumps(data) + "\n")
        print(f"{len(data['streams'])} requests, prices (ms) "
              f"{ {d: round(1e3 * s, 2) for d, s in sorted(data['seconds'].items())} }")
        return
    data = json.loads(Path(args.data[0]).read_text())
    data["streams"] = data["streams"][:args.requests]
    common = (args.passes, args.tokens, args.max_drafts, args.beyond, args.batch2)
    fixed = replay(data, f"cycle:{data['k']}", 0, *common)
    plain = replay(data, "cycle:0", 0, *common)
    print(f"{len(data['streams'])} requests x {args.tokens} tokens, simulated seconds per pass;"
          f" cycle:{data['k']} {fixed[0]:.3f} ({plain[0] / fixed[0]:.2f}x plain decoding)")
    for seed in range(args.seeds):
        auto = replay(data, "auto", seed, *common)
        print(f"seed {seed}: auto / cycle:{data['k']} by pass",
              " ".join(f"{f / a:.3f}" for f, a in zip(fixed, auto)))


if __name__ == "__main__":
    main()
