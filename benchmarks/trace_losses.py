"""What the drafting steps of a budget trace lost against plain decoding, per batch size.

    VLLM_ANYORDER_BUDGET_TRACE=DIR <any benchmark>; python -m benchmarks.trace_losses DIR

Per trace file (one engine worker) and batch size: clean steps (the batch ran unchanged),
plain and drafting; each drafting step is charged ``seconds - tokens * plain / batch``, with
``plain`` that engine's median plain step at that batch size (the books' rule, measured
after the fact). A negative total is a gain. This is how RESULTS attributes a wall-clock gap
to drafting or to the engine (its plain steps' medians, which differ between engines).
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

from benchmarks.budget_replay import read_trace_lines


def losses(lines: list[dict]) -> tuple[dict[int, dict], float]:
    """batch -> {plain_ms, drafting_steps, steps, lost_s}; and the clean steps' seconds."""
    steps: dict[int, list[tuple[bool, float, int]]] = defaultdict(list)
    for line in lines:
        if line["clean"]:
            tokens = sum(accepted + 1 for _, _, accepted in line["requests"])
            steps[len(line["requests"])].append((line["drafting"], line["seconds"], tokens))
    out = {}
    for batch, rows in sorted(steps.items()):
        plain = [s for drafting, s, _ in rows if not drafting]
        if not plain:
            continue
        median = statistics.median(plain)
        lost = sum(s - t * median / batch for drafting, s, t in rows if drafting)
        out[batch] = {"plain_ms": median * 1e3, "steps": len(rows), "lost_s": lost,
                      "drafting_steps": sum(d for d, _, _ in rows)}
    return out, sum(s for rows in steps.values() for _, s, _ in rows)


def main(argv: list[str] | None = None) -> None:
    for path in sorted(Path((argv or sys.argv[1:])[0]).glob("*.jsonl")):
        per_batch, total = losses(read_trace_lines(path))
        lost = sum(b["lost_s"] for b in per_batch.values())
        print(f"{path.name}: drafting lost {lost:.3f} s of {total:.2f} s of clean steps "
              f"({100 * lost / total if total else 0:+.2f}%)")
        for batch, b in per_batch.items():
            print(f"  batch {batch:>3}: {b['steps']} steps, {b['drafting_steps']} drafting, "
                  f"plain median {b['plain_ms']:.2f} ms, drafting lost {b['lost_s']:+.3f} s")


if __name__ == "__main__":
    main()
