"""Cost profiles for ``budget_replay.py``: the wall seconds of one engine step of a target, as
a function of the rows it evaluates, the requests in the batch and their cached context.

Three kinds, one JSON format (``{"name", "kind", "label", "targets": {target: {...}}}``,
files in ``benchmarks/profiles/``; :func:`load_profile` / :func:`save_profile`):

* ``measured`` -- fitted from a trace's own clean steps (``fit_measured``): per arm (drafting
  or plain decoding) the median seconds of each half-octave of rows, made non-decreasing
  (pooled adjacent violators), joined piecewise-linearly; beyond the largest measured count
  the last segment's slope continues, below the smallest the least-squares line of the arm (floored at a tenth of the smallest
  measured step). An arm with no step borrows the other's curve. Batch and context are not
  inputs (they are whatever the recorded run had).
* ``roofline`` -- ROOFLINE, NOT MEASURED: the published peak rates of a device, for a
  target shape (``target_shapes.py``); with R rows, B requests, C cached positions per request
  (mean), L layers, H query heads of dimension h:

      bytes   = 2 bytes x matmul weights (layers + output head, read once per step)
                + KV bytes per position x (B x C + R)       (each request's cache read once,
                                                              the new rows' K/V written)
      FLOPs   = 2 x matmul weights x R                       (every row through every matmul)
                + 4 x L x H x h x R x keys                   (QK^T and PV)
      keys    = C + (R / B + 1) / 2  (AR: causal over the request's own rows, on average)
                C + block            (dLLM: a canvas attends to itself, bidirectionally)
      seconds = max(bytes / (HBM bandwidth x eff_bw), FLOPs / (bf16 peak x eff_flops))
                + overhead_s

  ``overhead_s`` is a fixed per-step cost for kernel launches and the scheduler (2 ms by
  default: a parameter, not a measurement); the efficiencies are 1.0 (the ideal). Activations
  and norms are left out (< 1% of the bytes at 256 rows).
* ``gpu-measured`` -- forward times that ``gpu_forward_profile.py`` measured on a GPU (plain
  PyTorch, random bf16 weights), points ``{batch, rows, context, seconds}``; a query is
  interpolated linearly in rows, then between the two nearest measured batches and contexts
  (clamped at the grid's ends in batch and context and below the fewest rows measured,
  extrapolated linearly beyond the most), plus
  ``overhead_s`` (the forward alone has no scheduler).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.target_shapes import TargetShape, shape_from_dict

PROFILES = Path(__file__).resolve().parent / "profiles"
ROOFLINE_LABEL = "ROOFLINE (not measured)"
H100_SXM = {"name": "NVIDIA H100 SXM5 80GB", "hbm_bytes_per_s": 3.35e12,
            "bf16_flops_per_s": 989e12,
            "source": "NVIDIA H100 datasheet (SXM5): 3.35 TB/s HBM3, 989 TFLOP/s dense bf16"}


@dataclass
class Roofline:
    shape: TargetShape
    device: dict
    overhead_s: float = 0.002
    eff_bw: float = 1.0
    eff_flops: float = 1.0

    def seconds(self, rows: float, batch: int, context: float, drafting: bool = True) -> float:
        s, rows, batch = self.shape, float(rows), max(1, batch)
        moved = s.matmul_params * s.bytes_per_param + s.kv_bytes_per_token * (batch * context
                                                                              + rows)
        keys = context + (s.block if s.kind == "dllm" else (rows / batch + 1) / 2)
        flops = 2.0 * s.matmul_params * rows + 4.0 * s.layers * s.heads * s.head_dim * rows * keys
        return max(moved / (self.device["hbm_bytes_per_s"] * self.eff_bw),
                   flops / (self.device["bf16_flops_per_s"] * self.eff_flops)) + self.overhead_s

    def to_dict(self) -> dict:
        return {"shape": self.shape.as_dict(), "device": self.device,
                "overhead_s": self.overhead_s, "eff_bw": self.eff_bw,
                "eff_flops": self.eff_flops}


def piecewise(pts: list[tuple[float, float]], x: float) -> float:
    """Linear through sorted ``pts``; the end segments' slopes continue outside (one point:
    constant)."""
    if len(pts) == 1:
        return pts[0][1]
    i = 1
    while i < len(pts) - 1 and x > pts[i][0]:
        i += 1
    (x0, y0), (x1, y1) = pts[i - 1], pts[i]
    return y0 + (y1 - y0) * (x - x0) / max(x1 - x0, 1e-12)


def _monotone(pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted by rows, seconds made non-decreasing (more rows never cost less: a dip is noise)."""
    out: list[tuple[float, float]] = []
    for x, y in sorted(pts):
        out.append((x, max(y, out[-1][1]) if out else y))
    return out


@dataclass
class Measured:
    """Step seconds against rows per arm, fitted from recorded steps (see the module doc)."""

    plain: list[tuple[float, float]] = field(default_factory=list)
    drafting: list[tuple[float, float]] = field(default_factory=list)

    def seconds(self, rows: float, batch: int = 1, context: float = 0.0,
                drafting: bool = True) -> float:
        own = self.drafting if drafting else self.plain
        other = self.plain if drafting else self.drafting
        pts = _monotone(own or other)
        if not pts:
            raise ValueError("a measured profile without any step")
        if drafting and own and other:  # plain steps below the drafting range anchor it
            pts = _monotone(pts + [p for p in other if p[0] < pts[0][0]])
        if rows >= pts[0][0]:
            return max(piecewise(pts, rows), 1e-9)
        a, b = _least_squares(pts)
        return max(a + b * rows, 0.1 * pts[0][1]) if b > 0 else pts[0][1]

    def to_dict(self) -> dict:
        return {"plain": [list(p) for p in self.plain],
                "drafting": [list(p) for p in self.drafting]}


def _least_squares(pts: list[tuple[float, float]]) -> tuple[float, float]:
    if len(pts) < 2:
        return pts[0][1], 0.0
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    return my - b * mx, b


def fit_measured(steps: list[dict]) -> Measured:
    """A measured profile from a trace's clean steps (``seconds`` > 0): per arm, steps grouped
    in half-octave buckets of rows (a lone slow step, e.g. a GC pause, is outvoted by the
    bucket's median), then made non-decreasing by pooling adjacent violators (weighted by the
    steps each bucket holds)."""
    groups: dict[tuple[bool, int], list[tuple[float, float]]] = {}
    for st in steps:
        if st.get("clean") and st.get("seconds", 0) > 0:
            key = (bool(st["drafting"]), round(2 * math.log2(max(1, int(st["rows"])))))
            groups.setdefault(key, []).append((float(st["rows"]), float(st["seconds"])))
    arms: dict[bool, list[tuple[float, float, int]]] = {False: [], True: []}
    for (arm, _), samples in sorted(groups.items()):
        arms[arm].append((statistics.median(r for r, _ in samples),
                          statistics.median(s for _, s in samples), len(samples)))
    return Measured(plain=_pool_adjacent(arms[False]), drafting=_pool_adjacent(arms[True]))


def _pool_adjacent(pts: list[tuple[float, float, int]]) -> list[tuple[float, float]]:
    """Weighted isotonic fit of (rows, seconds, weight) by rows: a bucket slower than the
    next is merged with it (weighted means) until seconds never fall."""
    blocks: list[list[float]] = []  # [sum w*rows, sum w*seconds, sum w]
    for x, y, w in sorted(pts):
        blocks.append([w * x, w * y, float(w)])
        while len(blocks) > 1 and blocks[-2][1] / blocks[-2][2] > blocks[-1][1] / blocks[-1][2]:
            last = blocks.pop()
            blocks[-1] = [a + b for a, b in zip(blocks[-1], last)]
    return [(xs / w, ys / w) for xs, ys, w in blocks]


@dataclass
class Grid:
    """Measured forward seconds on a (batch, rows, context) grid + a fixed step overhead."""

    shape: TargetShape
    points: list[dict]
    overhead_s: float = 0.002

    def seconds(self, rows: float, batch: int, context: float, drafting: bool = True) -> float:
        contexts = sorted({p["context"] for p in self.points})
        c0, c1, wc = _bracket(contexts, context)
        return (1 - wc) * self._at(c0, rows, batch) + wc * self._at(c1, rows, batch) \
            + self.overhead_s

    def _at(self, context: float, rows: float, batch: int) -> float:
        here = [p for p in self.points if p["context"] == context]
        batches = sorted({p["batch"] for p in here})
        b0, b1, wb = _bracket(batches, batch)

        def curve(b):
            pts = _monotone([(p["rows"], p["seconds"]) for p in here if p["batch"] == b])
            return pts[0][1] if rows <= pts[0][0] else piecewise(pts, rows)

        return (1 - wb) * curve(b0) + wb * curve(b1)

    def to_dict(self) -> dict:
        return {"shape": self.shape.as_dict(), "overhead_s": self.overhead_s,
                "points": self.points}


def _bracket(values: list[float], x: float) -> tuple[float, float, float]:
    """The measured values around x and x's weight on the upper one (clamped at the ends)."""
    if x <= values[0]:
        return values[0], values[0], 0.0
    for lo, hi in zip(values, values[1:]):
        if x <= hi:
            return lo, hi, (x - lo) / (hi - lo)
    return values[-1], values[-1], 0.0


KINDS = {"measured": lambda d: Measured([tuple(p) for p in d["plain"]],
                                        [tuple(p) for p in d["drafting"]]),
         "roofline": lambda d: Roofline(shape_from_dict(d["shape"]), d["device"],
                                        d["overhead_s"], d["eff_bw"], d["eff_flops"]),
         "gpu-measured": lambda d: Grid(shape_from_dict(d["shape"]), d["points"],
                                        d["overhead_s"])}


@dataclass
class Profile:
    name: str
    kind: str  # measured | roofline | gpu-measured
    label: str  # what a reader must know: measured where, or ROOFLINE (not measured)
    targets: dict  # target name -> Roofline | Measured | Grid
    notes: str = ""

    def target_for(self, kind: str):
        """(name, cost) of the target for a trace of ``kind`` ("ar" / "dllm"); a measured
        profile has one target, the trace's own model."""
        for name, cost in self.targets.items():
            shape = getattr(cost, "shape", None)
            if shape is None or shape.kind == kind:
                return name, cost
        raise KeyError(f"profile {self.name} has no {kind} target ({list(self.targets)})")

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "label": self.label, "notes": self.notes,
                "targets": {k: v.to_dict() for k, v in self.targets.items()}}


def profile_from_dict(d: dict) -> Profile:
    if d.get("kind") not in KINDS:
        raise ValueError(f"profile kind must be one of {list(KINDS)}, got {d.get('kind')!r}")
    make = KINDS[d["kind"]]
    return Profile(d["name"], d["kind"], d["label"],
                   {k: make(v) for k, v in d["targets"].items()}, d.get("notes", ""))


def load_profile(path_or_name: str | Path) -> Profile:
    """A profile file, or the name of one in ``benchmarks/profiles/`` (``h100-roofline``)."""
    path = Path(path_or_name)
    if not path.exists():
        path = PROFILES / f"{path_or_name}.json"
    return profile_from_dict(json.loads(path.read_text()))


def save_profile(profile: Profile, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.to_dict(), indent=1) + "\n")
    return path


def h100_roofline(overhead_s: float = 0.002) -> Profile:
    """The committed ``h100-roofline`` profile (``python -m benchmarks.cost_profiles``)."""
    from benchmarks.target_shapes import LLADA_8B, LLAMA_8B

    return Profile("h100-roofline", "roofline",
                   f"{ROOFLINE_LABEL}: {H100_SXM['name']} peak rates, {overhead_s * 1e3:g} ms "
                   f"per-step overhead (assumed)",
                   {s.name: Roofline(s, H100_SXM, overhead_s) for s in (LLAMA_8B, LLADA_8B)},
                   notes="formulas: benchmarks/cost_profiles.py docstring")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="write benchmarks/profiles/h100-roofline.json")
    ap.add_argument("--overhead-ms", type=float, default=2.0)
    ap.add_argument("--out", default=str(PROFILES / "h100-roofline.json"))
    args = ap.parse_args()
    print(save_profile(h100_roofline(args.overhead_ms / 1e3), args.out))
