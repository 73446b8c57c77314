"""Where one mode's time goes against another's, per batch size, from budget traces.

    VLLM_ANYORDER_BUDGET_TRACE=DIR .venv/bin/python -m benchmarks.bench_switch --interleave ...
    .venv/bin/python -m benchmarks.trace_steps DIR

``bench_switch --interleave`` runs every mode on the same closed batches, so per batch size
(a closed batch shrinks as its requests finish: its tail is batch sizes below the full one)
the modes' clean steps can be set side by side: steps, seconds, committed tokens, tokens per
ms. This is how RESULTS placed ~70% of ``jacobi``'s batch-4 gap in the tail (issue 22, Zen 4,
2026-12-03).

Also the row changes of one mode: drafting steps that follow a drafting step at the same
batch size, split by whether the row count changed, with their median seconds and mean rows
(probe steps and the step after one are left out: a probe changes rows on purpose). On that
VM a change cost 0.2-0.5 ms (5-15%) at similar rows in four of five traces (none in the
fifth), a cost the controller does not price.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

from benchmarks.budget_replay import read_trace_lines
from benchmarks.trace_losses import committed


def by_batch(lines: list[dict]) -> dict[tuple[str, int], tuple[int, float, int]]:
    """(mode, batch size) -> (clean steps, their seconds, committed tokens)."""
    out: dict[tuple[str, int], list] = defaultdict(lambda: [0, 0.0, 0])
    for line in lines:
        if line["clean"] and not line.get("unit"):
            row = out[(line.get("mode", "auto"), len(line["requests"]))]
            row[0] += 1
            row[1] += line["seconds"]
            row[2] += committed(line)
    return {k: (n, s, t) for k, (n, s, t) in sorted(out.items())}


def row_changes(lines: list[dict], mode: str = "auto") -> dict[bool, list[tuple[float, int]]]:
    """changed -> [(seconds, rows)] of ``mode``'s clean drafting steps that follow a clean
    drafting step of the same mode and batch size (probes and the step after one left out);
    ``changed``: the row count differs from that step's."""
    out: dict[bool, list[tuple[float, int]]] = {False: [], True: []}
    for before, line in zip(lines, lines[1:]):
        same_kind = all(x["clean"] and x["drafting"] and x.get("mode", "auto") == mode
                        and not x.get("probe") for x in (before, line))
        if same_kind and len(before["requests"]) == len(line["requests"]):
            out[line["rows"] != before["rows"]].append((line["seconds"], line["rows"]))
    return out


def main(argv: list[str] | None = None) -> None:
    for path in sorted(Path((argv or sys.argv[1:])[0]).glob("*.jsonl")):
        lines = read_trace_lines(path)
        print(path.name)
        for (mode, batch), (n, s, t) in by_batch(lines).items():
            print(f"  {mode:>6} batch {batch:>3}: {n:5d} steps, {s * 1e3:8.0f} ms, {t:6d} "
                  f"tokens, {t / (s * 1e3) if s else 0:.2f} tokens/ms, "
                  f"{s * 1e3 / n:.2f} ms a step")
        for changed, steps in row_changes(lines).items():
            if steps:
                print(f"  auto drafting after drafting, rows {'changed' if changed else 'kept'}"
                      f": {len(steps)} steps, median "
                      f"{statistics.median(s for s, _ in steps) * 1e3:.2f} ms, mean rows "
                      f"{statistics.fmean(r for _, r in steps):.1f}")


if __name__ == "__main__":
    main()
