"""What the drafting steps of a budget trace lost against plain decoding, per batch size.

    VLLM_ANYORDER_BUDGET_TRACE=DIR <any benchmark>; python -m benchmarks.trace_losses DIR

Per trace file (one engine worker), per budget mode (``auto``, or the mode a benchmark
switched to: ``bench_serve --modes``, ``bench_switch``) and batch size: clean steps (the
batch ran unchanged), plain and drafting; each drafting step is charged
``seconds - tokens * plain / batch``, with ``plain`` that engine's median plain step at that
batch size over every mode (the books' rule, measured after the fact). A negative total is a
gain. This is how RESULTS attributes a wall-clock gap to drafting or to the engine (its plain
steps' medians, which differ between engines and drift between client runs).

Also per mode: the steps in which the batch changed (a request joined or left: not clean,
their time is the gap since the step before; gaps over ``IDLE`` seconds are idle time between
client runs), and what they took over the tokens they committed at the plain price: their
excess. Drafting takes a closed-loop benchmark's requests out of lock step, so their prefills
stop sharing steps: at T=0.8, c=8, ``auto`` ran 110 such steps against 42 with drafts off,
1.76 s against 0.90 s. Their time alone blamed that for ``auto``'s loss (issue 22, the ninth
Xeon session); they also committed 818 tokens against 235, and the excess was 0.59 s against
0.57 s: split prefills cost what shared ones do.

Per trace file, the plain steps after drafting (:func:`after_drafting`: ``auto``'s plain
steps at the usual batch size by measured steps since its last drafting step, against the
other modes' median: +0.6-2.4 ms the first, up to +1.9 ms the next four, issue 22) and the
client runs in time order (:func:`passes`: each run's mode, plain step median, drafting steps
and how often the books held drafting back).

And, for ``auto``'s first draft position, the prediction against the outcome by what the
request's step before did (``history``): drafted nothing, had a draft rejected, or had its
whole chain accepted (Jacobi iterates are cold after plain steps and refined after a
rejection; the acceptance model prices them alike).

And for ``auto``, how well the controller predicted: per draft position, the mean gain it
priced the drafted rows at (trace lines carry each verified chain's ``gains``) against the
share of them accepted (``core/budget_calibration`` scales the gains to match these).
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

from benchmarks.budget_replay import read_trace_lines
from vllm_anyorder.core.budget_calibration import position_bucket

IDLE = 0.5  # seconds: a longer gap before a step is idle time, not that step's


def committed(line: dict) -> int:
    """Tokens a trace line's step committed: each request's accepted drafts and one more."""
    return sum(accepted + 1 for _, _, accepted in line["requests"])


def plain_medians(lines: list[dict]) -> dict[int, float]:
    """batch -> the median seconds of its clean plain steps (every mode)."""
    plain: dict[int, list[float]] = defaultdict(list)
    for line in lines:
        if line["clean"] and not line["drafting"]:
            plain[len(line["requests"])].append(line["seconds"])
    return {batch: statistics.median(s) for batch, s in plain.items()}


def losses(lines: list[dict], mode: str | None = None,
           medians: dict[int, float] | None = None) -> tuple[dict[int, dict], float]:
    """batch -> {plain_ms, drafting_steps, steps, lost_s}; and the clean steps' seconds. Only
    ``mode``'s steps (None: all); ``medians``: the plain prices (default: these lines')."""
    medians = plain_medians(lines) if medians is None else medians
    steps: dict[int, list[tuple[bool, float, int]]] = defaultdict(list)
    for line in lines:
        if line["clean"] and (mode is None or line.get("mode", "auto") == mode):
            steps[len(line["requests"])].append((line["drafting"], line["seconds"],
                                                 committed(line)))
    out = {}
    for batch, rows in sorted(steps.items()):
        median = medians.get(batch)
        if median is None:
            continue
        lost = sum(s - t * median / batch for drafting, s, t in rows if drafting)
        out[batch] = {"plain_ms": median * 1e3, "steps": len(rows), "lost_s": lost,
                      "drafting_steps": sum(d for d, _, _ in rows)}
    return out, sum(s for rows in steps.values() for _, s, _ in rows)


def batch_changes(lines: list[dict], mode: str,
                  medians: dict[int, float] | None = None) -> tuple[int, float, float]:
    """``mode``'s steps in which the batch changed, their seconds (gap since the step
    before, idle gaps left out) and their excess: those seconds less the tokens they
    committed at the plain price of their batch size (``medians``, default these lines';
    a batch size without plain steps: the nearest one's)."""
    medians = plain_medians(lines) if medians is None else medians
    n, seconds, excess = 0, 0.0, 0.0
    for before, line in zip(lines, lines[1:]):
        if line["clean"] or line.get("mode", "auto") != mode:
            continue
        gap = line["t"] - before["t"]
        if 0 < gap <= IDLE:
            n, seconds = n + 1, seconds + gap
            batch = len(line["requests"])
            if medians and batch:
                near = min(medians, key=lambda b: (abs(b - batch), b))
                excess += gap - committed(line) * medians[near] / near
            else:
                excess += gap
    return n, seconds, excess


HISTORIES = ("after plain", "after a rejection", "after a whole chain")


def first_draft_by_history(lines: list[dict], mode: str = "auto"
                           ) -> dict[str, tuple[int, float, float]]:
    """History (:data:`HISTORIES`: what the request's step before did) -> (chains, mean
    predicted gain of the first draft, share accepted) over ``mode``'s verified chains that
    carry the gains they were priced at. A request absent from the step before (it joined,
    or that step was another mode's) counts as after plain."""
    sums: dict[str, list[float]] = {h: [0, 0.0, 0.0] for h in HISTORIES}
    before: dict[str, tuple[int, int]] = {}  # req_id -> (drafted, accepted) the step before
    for line in lines:
        mine = line.get("mode", "auto") == mode
        gains = line.get("gains") or {}
        now = {}
        for req_id, drafted, accepted in line["requests"]:
            now[req_id] = (drafted, accepted) if mine else (0, 0)
            if not (mine and drafted and gains.get(req_id)):
                continue
            k, a = before.get(req_id, (0, 0))
            history = HISTORIES[0] if not k else HISTORIES[1] if a < k else HISTORIES[2]
            s = sums[history]
            s[0] += 1
            s[1] += gains[req_id][0]
            s[2] += accepted > 0
        before = now
    return {h: (int(n), p / n, a / n) for h, (n, p, a) in sums.items() if n}


def calibration(lines: list[dict], mode: str = "auto") -> dict[int, tuple[int, float, float]]:
    """Position bucket (``position_bucket``) -> (drafted rows, mean predicted gain, share
    accepted) over ``mode``'s verified chains that carry the gains they were priced at."""
    sums: dict[int, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for line in lines:
        gains = line.get("gains")
        if not gains or line.get("mode", "auto") != mode:
            continue
        for req_id, drafted, accepted in line["requests"]:
            for j, g in enumerate(gains.get(req_id, [])[:drafted]):
                s = sums[position_bucket(j)]
                s[0] += 1
                s[1] += g
                s[2] += j < accepted
    return {b: (int(n), p / n, a / n) for b, (n, p, a) in sorted(sums.items())}


def bucket_label(bucket: int) -> str:
    """The 1-based draft positions of a position bucket: "3", "9-11"."""
    positions = [j + 1 for j in range(1024) if position_bucket(j) == bucket]
    lo, hi = positions[0], positions[-1]
    return str(lo) if lo == hi else f"{lo}-{hi}"


DISTANCES = ((1, 1), (2, 5), (6, 30), (31, None))  # steps since drafting, as printed


def usual_batch(lines: list[dict]) -> int | None:
    """The batch size of most clean plain steps (ties: the larger)."""
    sizes = [len(line["requests"]) for line in lines if line["clean"] and not line["drafting"]]
    return max(set(sizes), key=lambda b: (sizes.count(b), b)) if sizes else None


def after_drafting(lines: list[dict], batch: int, mode: str = "auto"
                   ) -> dict[str, tuple[int, float]]:
    """Label ("1", "2-5", "6-30", ">30") -> (steps, median seconds) of ``mode``'s clean plain
    steps of ``batch`` requests, by clean steps since that mode's last drafting step (none
    counted before its first, nor across another mode's steps)."""
    labels = [str(lo) if lo == hi else f"{lo}-{hi}" if hi else f">{lo - 1}"
              for lo, hi in DISTANCES]
    since, found = None, {label: [] for label in labels}
    for line in lines:
        if line.get("mode", "auto") != mode:
            since = None
            continue
        if not line["clean"]:
            continue
        if line["drafting"]:
            since = 0
            continue
        if since is None:
            continue
        since += 1
        if len(line["requests"]) == batch:
            for (lo, hi), label in zip(DISTANCES, labels):
                if since >= lo and (hi is None or since <= hi):
                    found[label].append(line["seconds"])
    return {label: (len(v), statistics.median(v)) for label, v in found.items() if v}


def passes(lines: list[dict], batch: int | None, idle: float = 2.0,
           least: int = 200) -> list[dict]:
    """The client runs in time order: one mode's steps, split where the mode changes or the
    engine idled over ``idle`` s; those of at least ``least`` steps, each {mode, steps,
    drafting (clean drafting steps), guarded (steps the books held plain), plain_s (median
    clean plain step of ``batch`` requests; None: none)}."""
    runs: list[list[dict]] = []
    for before, line in zip([None] + lines[:-1], lines):
        if before is None or line.get("mode", "auto") != before.get("mode", "auto") \
                or line["t"] - before["t"] > idle:
            runs.append([])
        runs[-1].append(line)
    out = []
    for run in runs:
        if len(run) < least:
            continue
        plain = [x["seconds"] for x in run if x["clean"] and not x["drafting"]
                 and len(x["requests"]) == batch]
        out.append({"mode": run[0].get("mode", "auto"), "steps": len(run),
                    "drafting": sum(1 for x in run if x["clean"] and x["drafting"]),
                    "guarded": sum(1 for x in run if x.get("guarded")),
                    "plain_s": statistics.median(plain) if plain else None})
    return out


def main(argv: list[str] | None = None) -> None:
    for path in sorted(Path((argv or sys.argv[1:])[0]).glob("*.jsonl")):
        lines = read_trace_lines(path)
        medians = plain_medians(lines)
        modes = sorted({line.get("mode", "auto") for line in lines})
        for mode in modes:
            per_batch, total = losses(lines, mode if len(modes) > 1 else None, medians)
            lost = sum(b["lost_s"] for b in per_batch.values())
            changed, changed_s, excess = batch_changes(lines, mode, medians)
            print(f"{path.name} {mode}: drafting lost {lost:.3f} s of {total:.2f} s of clean "
                  f"steps ({100 * lost / total if total else 0:+.2f}%); {changed} batch "
                  f"changes, {changed_s:.2f} s, {excess:.2f} s over their tokens' plain price")
            calib = calibration(lines, mode)
            if calib:
                print("  predicted / accepted by draft position: " + " ".join(
                    f"{bucket_label(b)}: {p:.2f}/{a:.2f} ({n})" for b, (n, p, a) in calib.items()))
                print("  first draft, predicted / accepted: " + "; ".join(
                    f"{h}: {p:.2f}/{a:.2f} ({n})"
                    for h, (n, p, a) in first_draft_by_history(lines, mode).items()))
            for batch, b in per_batch.items():
                print(f"  batch {batch:>3}: {b['steps']} steps, {b['drafting_steps']} "
                      f"drafting, plain median {b['plain_ms']:.2f} ms, drafting lost "
                      f"{b['lost_s']:+.3f} s")
        batch = usual_batch(lines)
        ref = plain_medians([x for x in lines if x.get("mode", "auto") != "auto"]).get(batch)
        after = after_drafting(lines, batch) if batch else {}
        if after and ref is not None:
            print(f"  auto's plain steps at batch {batch} by steps since drafting, against "
                  f"the other modes' {1e3 * ref:.2f} ms: " + " ".join(
                      f"{label}: {1e3 * (m - ref):+.2f} ms ({n})"
                      for label, (n, m) in after.items()))
        runs = passes(lines, batch)
        if len(runs) > 1:
            print("  client runs: " + " ".join(
                f"{r['mode']} {1e3 * r['plain_s']:.2f} ms ({r['drafting']} drafting, "
                f"{r['guarded']} held back)" if r["plain_s"] else f"{r['mode']} -"
                for r in runs))


if __name__ == "__main__":
    main()
