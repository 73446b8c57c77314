"""Replay recorded acceptance traces against cost profiles: what the speculation budget would
choose, and the projected speed-up, on a machine we do not have (issue 22, "trace replay").

    .venv/bin/python -m benchmarks.budget_replay benchmarks/results/traces/jacobi-n16 \\
        --profile h100-roofline [--profile benchmarks/profiles/h100-measured.json]

A trace (``record_trace.py``: ``VLLM_ANYORDER_BUDGET_TRACE``, budget ``fixed``) holds per
engine step each request's drafts D_t (the method's maximum there) and accepted drafts A_t.
Outputs are identical on every machine, so A_t is too; only the step seconds are the
recording machine's. Each policy is replayed step by step over the recorded steps:

* ``no speculation``: every request commits 1 token; the step evaluates the batch's rows;
* ``fixed k``: cap c = min(k, D_t) per request;
* ``auto``: the real ``core.budget.BudgetController`` (``allot`` with the limits D_t), fed
  each step with the verification outcomes under its caps and the profile's predicted
  seconds as its measurement (so it learns the profile's cost curve as it would online).

THE APPROXIMATION (printed with every result): a request capped at c commits min(A_t, c) + 1
tokens in step t; the steps, batches and contexts are the recorded ones. A request that commits
fewer tokens per step would really take more steps, and a shorter chain can change later
drafts; both are ignored (the standard expected-tokens-per-step model). Prefill steps are left
out (the same for every policy), and so are steps where a request had no recorded outcome.
Throughput = committed tokens / predicted seconds, summed over the replayed steps; the trace is
replayed back to back (request ids renamed each round, the controller kept warm) until at least
``--min-steps`` steps, so ``auto`` is seen past its warm-up.

Profiles (``cost_profiles.py``): ``measured`` is always fitted from the trace's own clean
steps; ``--profile`` adds files or names in ``benchmarks/profiles/``. Every figure printed or
written names its profile; a ROOFLINE profile's figures are projections, never measurements.
The roofline and gpu-measured profiles cost one target forward: ``assd``'s self-drafting
forward (its query stream over each drafting request's last token and drafts) is added as a
second forward of those rows; for ``specdiff`` the drafter's forwards are missing there (said
with its results). For a dLLM trace (``stepwise`` / ``ssd`` / ``freedave``) the units are
canvases: a request capped at N evaluates N + 1 canvases of ``block`` rows, and "tokens" are
denoising steps (this assumes the trace records drafted / accepted steps per request).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.common import REPO
from benchmarks.cost_profiles import Profile, fit_measured, load_profile
from vllm_anyorder.core.assd_drafters import DRAFTERS
from vllm_anyorder.methods import METHODS
from vllm_anyorder.core.budget import BudgetController
from vllm_anyorder.core.budget_settings import BudgetSettings

APPROXIMATION = ("replay approximation: a request capped at c commits min(A_t, c) + 1 tokens "
                 "in recorded step t; recorded steps, batches and contexts; prefill excluded")
DLLM_METHODS = tuple(name for name, spec in METHODS.items() if spec.target_family == "diffusion")
SEPARATE_DRAFTER = ("specdiff",)  # a drafter model whose forwards the GPU profiles leave out
DRAFTER_CAVEAT = ("this profile costs the target's forward only: the drafter's forwards are "
                  "not in it, so the projection is optimistic")


@dataclass
class Step:
    req_ids: list[str]
    limits: list[int]  # D_t: drafts recorded at the maximum size
    accepted: list[int]  # A_t
    base: int  # rows (canvases) that are not drafts: the batch
    context: float  # mean cached positions per request before the step


@dataclass
class Trace:
    name: str
    method: str
    kind: str  # "ar" | "dllm"
    block: int  # rows per unit (dLLM canvas); 1 for AR
    steps: list[Step]
    raw: list[dict]  # the recorded lines (the measured profile is fitted from them)
    meta: dict = field(default_factory=dict)
    target_drafts: bool = False  # drafting is a forward of the target (assd's query stream)


def read_trace_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def build_trace(name: str, lines: list[dict], meta: dict) -> Trace:
    """Steps from trace lines; contexts = the mean prompt + what the request committed."""
    method = meta.get("method", "")
    kind = "dllm" if method in DLLM_METHODS else "ar"
    options = (meta.get("additional_config") or {}).get("anyorder", {}).get(method, {})
    block = int(options.get("block_length", 32)) if kind == "dllm" else 1
    prompt = statistics.fmean(meta.get("prompt_tokens") or [0])
    done: dict[str, int] = {}
    steps = []
    for line in lines:
        outcomes = line.get("requests") or []
        if not outcomes:
            continue
        ids = [r for r, _, _ in outcomes]
        limits = [int(d) for _, d, _ in outcomes]
        accepted = [min(int(a), int(d)) for _, d, a in outcomes]
        base = max(len(ids), int(line["rows"]) - sum(limits))
        context = prompt + statistics.fmean(done.get(r, 0) for r in ids)
        steps.append(Step(ids, limits, accepted, base, context))
        for r, a in zip(ids, accepted):
            done[r] = done.get(r, 0) + a + 1
    drafter = DRAFTERS.get(options.get("drafter", "self")) if method == "assd" else None
    return Trace(name, method, kind, block, steps, lines, meta,
                 target_drafts=bool(drafter and drafter.queries_target))


def load_traces(path: str | Path) -> list[Trace]:
    """A recording directory (``meta.json`` + ``trace-<pid>.jsonl``, one trace per distinct
    file: tensor-parallel ranks write identical ones) or one ``.jsonl`` file."""
    path = Path(path)
    files = sorted(path.glob("trace-*.jsonl")) if path.is_dir() else [path]
    meta_file = (path if path.is_dir() else path.parent) / "meta.json"
    meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
    traces, seen = [], set()
    for f in files:
        text = f.read_text()
        if text in seen:
            continue
        seen.add(text)
        name = path.name if len(files) == 1 else f"{path.name}/{f.stem}"
        traces.append(build_trace(name, read_trace_lines(f), meta))
    return traces


def measured_profile(trace: Trace) -> Profile:
    fit = fit_measured(trace.raw)
    rows = [p[0] for p in fit.plain + fit.drafting]
    machine = trace.meta.get("machine", {}).get("cpu", "the recording machine")
    label = (f"MEASURED: this trace's own clean steps on {machine} "
             f"({trace.meta.get('dtype', '?')}), rows {min(rows):g}-{max(rows):g} measured"
             + ("" if fit.plain else "; no plain step recorded: the no-speculation cost is "
                "the drafting steps' curve extrapolated (drafting work included)"))
    return Profile(f"measured:{trace.name}", "measured", label,
                   {trace.meta.get("model", trace.name): fit})


@dataclass
class PolicyResult:
    policy: str
    tokens: int = 0
    seconds: float = 0.0
    draft_rows: int = 0  # drafts allotted over all steps
    request_steps: int = 0  # sum of batch sizes over the steps
    steps: int = 0
    steps_without_drafts: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def summary(self, plain: float) -> dict:
        return {**asdict(self), "tokens_per_s": round(self.tokens_per_s, 3),
                "speedup_vs_no_spec": round(self.tokens_per_s / plain, 4) if plain else None,
                "mean_draft_rows_per_request": round(self.draft_rows / max(1, self.request_steps),
                                                     3),
                "share_steps_without_drafts": round(self.steps_without_drafts
                                                    / max(1, self.steps), 4)}


def replay(trace: Trace, cost, policy: str | int, min_steps: int = 0,
           drafting_forward: bool = False) -> PolicyResult:
    """One policy over the trace (repeated back to back up to ``min_steps`` steps);
    ``drafting_forward``: a step with drafts also pays one forward of the drafting rows
    (each drafting request's last token + its drafts: ``assd``'s query stream)."""
    name = policy if isinstance(policy, str) else f"fixed k={policy}"
    out = PolicyResult(name)
    max_drafts = max([max(s.limits) for s in trace.steps] + [1])
    controller = BudgetController(BudgetSettings("auto", max_drafts)) if policy == "auto" \
        else None
    rounds = max(1, -(-min_steps // max(1, len(trace.steps))))
    for rnd in range(rounds):
        for st in trace.steps:
            ids = [f"{r}#{rnd}" for r in st.req_ids]
            if policy == "no speculation":
                caps = [0] * len(ids)
            elif controller is not None:
                caps = controller.allot(ids, st.limits)
            else:
                caps = [min(int(policy), d) for d in st.limits]
            drafts = sum(caps)
            units = st.base + drafts
            seconds = cost.seconds(units * trace.block, len(ids), st.context, drafts > 0)
            if drafting_forward and drafts:
                drafting = sum(1 for c in caps if c)
                seconds += cost.seconds(drafting + drafts, drafting, st.context, True)
            tokens = sum(min(a, c) + 1 for a, c in zip(st.accepted, caps))
            out.tokens += tokens
            out.seconds += seconds
            out.draft_rows += drafts
            out.request_steps += len(ids)
            out.steps += 1
            out.steps_without_drafts += drafts == 0
            if controller is not None:
                for r, c, a in zip(ids, caps, st.accepted):
                    if c:
                        controller.record_verified(r, c, min(a, c))
                controller.record_step(units, drafts > 0, seconds, len(ids), tokens)
                controller.forget(set(ids))
    return out


def sweep(max_drafts: int) -> list[int]:
    ks, k = [], 1
    while k < max_drafts:
        ks.append(k)
        k *= 2
    return ks + [max_drafts]


def recorded_rate(trace: Trace) -> float | None:
    """MEASURED tokens/s of the recording's clean steps (checks the measured profile's replay
    of the recorded policy; never mixed into the projections)."""
    clean = [line for line in trace.raw if line.get("clean") and line.get("seconds", 0) > 0]
    secs = sum(line["seconds"] for line in clean)
    tokens = sum(min(a, d) + 1 for line in clean for _, d, a in line["requests"])
    return tokens / secs if secs else None


def replay_all(trace: Trace, profile: Profile, min_steps: int) -> dict:
    target, cost = profile.target_for(trace.kind)
    max_drafts = max([max(s.limits) for s in trace.steps] + [1])
    policies: list[str | int] = ["no speculation", *sweep(max_drafts), "auto"]
    # a measured step already holds the drafting forward; a GPU profile's does not
    extra = trace.target_drafts and profile.kind != "measured"
    results = [replay(trace, cost, p, min_steps, extra) for p in policies]
    plain = results[0].tokens_per_s
    rows = [r.summary(plain) for r in results]
    fixed = [r for r in rows if r["policy"].startswith("fixed")]
    best = max(fixed, key=lambda r: r["tokens_per_s"])
    caveat = DRAFTER_CAVEAT if trace.method in SEPARATE_DRAFTER and \
        profile.kind != "measured" else ""
    return {"trace": trace.name, "method": trace.method, "profile": profile.name,
            "caveat": caveat, "drafting_forward_added": extra,
            "profile_kind": profile.kind, "profile_label": profile.label, "target": target,
            "approximation": APPROXIMATION, "replayed_steps": results[0].steps,
            "trace_steps": len(trace.steps), "policies": rows,
            "auto": rows[-1], "best_fixed": best}


def print_result(res: dict) -> None:
    p = res["profile"]
    print(f"\n== trace {res['trace']} ({res['method']}, {res['trace_steps']} steps, replayed "
          f"{res['replayed_steps']}) on profile {p} [{res['profile_label']}], "
          f"target {res['target']}")
    print(f"   {res['approximation']}")
    if res["caveat"]:
        print(f"   CAVEAT: {res['caveat']}")
    if res["drafting_forward_added"]:
        print("   the self-drafting forward is costed as a second forward of the drafting rows")
    print(f"   {'policy':<16} {'tokens/s':>10} {'x no-spec':>9} {'drafts/req':>10} "
          f"{'no-draft steps':>14}  profile")
    for r in res["policies"]:
        print(f"   {r['policy']:<16} {r['tokens_per_s']:>10.1f} {r['speedup_vs_no_spec']:>9.3f} "
              f"{r['mean_draft_rows_per_request']:>10.2f} "
              f"{r['share_steps_without_drafts']:>14.0%}  {p}")
    a, b = res["auto"], res["best_fixed"]
    print(f"   projected on {p}: auto {a['speedup_vs_no_spec']:.3f}x no speculation "
          f"({a['mean_draft_rows_per_request']:.2f} drafts per request, "
          f"{a['share_steps_without_drafts']:.0%} of steps without drafts); best fixed "
          f"({b['policy']}) {b['speedup_vs_no_spec']:.3f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+", help="recording directories or trace-*.jsonl files")
    ap.add_argument("--profile", action="append", default=[],
                    help="profile file or name in benchmarks/profiles/ (repeatable); the "
                         "trace's own measured profile is always included")
    ap.add_argument("--min-steps", type=int, default=400,
                    help="replay each trace back to back until this many steps")
    ap.add_argument("--fit-out", help="also save each trace's measured profile here (a dir)")
    ap.add_argument("--out", help="JSON results (default benchmarks/results/replay-<time>.json)")
    args = ap.parse_args(argv)

    profiles = [load_profile(p) for p in args.profile]
    results = []
    for path in args.traces:
        for trace in load_traces(path):
            own = measured_profile(trace)
            if args.fit_out:
                from benchmarks.cost_profiles import save_profile

                save_profile(own, Path(args.fit_out) / f"measured-{trace.name}.json")
            rate = recorded_rate(trace)
            if rate:
                print(f"\n(MEASURED, not replayed) trace {trace.name}: the recording's clean "
                      f"steps ran {rate:.1f} tokens/s on its own machine")
            for profile in [own, *profiles]:
                res = replay_all(trace, profile, args.min_steps)
                res["recorded_tokens_per_s"] = rate
                print_result(res)
                results.append(res)
    out = Path(args.out) if args.out else \
        REPO / "benchmarks" / "results" / f"replay-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"approximation": APPROXIMATION, "results": results}, indent=1)
                   + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
