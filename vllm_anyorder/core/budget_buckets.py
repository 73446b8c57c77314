"""The step-cost model's row-count buckets (``budget_models.StepCost``; also the drafting
prices per batch size, ``budget_batch_prices``): a low quantile of the seconds of the steps
measured at a row count, and their running mean."""

from __future__ import annotations

import math
from dataclasses import dataclass

YOUNG_SAMPLES = 3  # a cost bucket with fewer samples is young (its figure is not yet trusted)


def bucket_of(rows: int) -> int:
    """Exact up to 16 rows (where a CPU's cost curve bends), then four per doubling."""
    if rows <= 16:
        return max(1, rows)
    return 17 + int(4 * math.log2(rows / 16.0))


@dataclass
class Bucket:
    """One row-count bucket's measured steps."""

    rows: float
    seconds: float  # a low quantile of the samples
    samples: int
    step: int  # controller step of the last sample (staleness)
    typical: float  # their running mean (the loss guard's baseline: time as it passes)

    def add(self, rows: int, seconds: float, step: int, down: float, up: float) -> None:
        """One more step: the low quantile falls by ``down`` towards a faster sample and rises
        by ``up`` towards a slower one (a young bucket takes its fastest sample outright)."""
        weight = min(self.samples + 1, 20)
        if self.samples < YOUNG_SAMPLES:
            self.seconds = self.typical = min(self.seconds, seconds)
        else:
            w = down if seconds < self.seconds else up
            self.seconds += w * (seconds - self.seconds)
            self.typical += (seconds - self.typical) / weight
        self.rows += (rows - self.rows) / weight
        self.samples += 1
        self.step = step


def observe_bucket(table: dict[int, Bucket], rows: int, seconds: float, step: int,
                   down: float, up: float) -> None:
    """Add one step to its row count's bucket of ``table`` (a new bucket for a new count)."""
    b = table.get(bucket_of(rows))
    if b is None:
        table[bucket_of(rows)] = Bucket(float(rows), float(seconds), 1, step, float(seconds))
    else:
        b.add(rows, seconds, step, down, up)
