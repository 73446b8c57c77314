"""Serving benchmark with vLLM's own client: ``vllm-anyorder bench serve`` against one
``vllm-anyorder serve`` per method (one server alive at a time), at several concurrencies.

    python -m benchmarks.bench_serve --model models/ar-target \\
        --methods none,jacobi,ngram --concurrency 1,4,8 --num-prompts 40

Per method: start the server (``load_test.Server``: loopback, the CPU's dtype, a KV cache
that holds every concurrent request), then per ``--concurrency`` value (and per
``--request-rate``, default ``inf``: all requests at once, limited by the concurrency) run
vLLM's benchmark client with ``--save-result`` and keep its JSON. Prompts: the project's
benchmark prompts (``common.load_prompts``) written as a ``custom`` JSONL, and/or
``--dataset random`` (vLLM's random token ids). Every request generates ``--max-tokens``
tokens (``--ignore-eos``).

Methods: ``none`` (no speculation), ``jacobi``, ``ngram``, ``specdiff``, ``draft_model`` at
``--k`` drafts (``benchmarks/configs.py``), plus any ``--config LABEL SPEC_JSON
[ADDITIONAL_JSON]`` (what ``--speculative-config`` / ``--additional-config`` take).
``--modes "auto;cycle:0"``: each plugin method's server runs every point once per budget
mode, switched live between client runs (rows ``LABEL@MODE``, each also against the first
mode on the same servers: the spread between server instances, 5-10% on a 2-core VM, cancels).
``--temperature`` (default 0: greedy) is passed to the client with ``--seed 0``.
Writes ``benchmarks/results/serve-<time>.json`` (one row per method x concurrency x rate:
output throughput, TPOT, TTFT, vLLM's acceptance length, the repetition share of the
generated text (repeated 4-grams of its tokens: the tiny targets loop, which flatters n-gram
and Jacobi drafts), a hash of the generated texts (greedy in float32: equal across methods;
``--dtype``); plus each raw vLLM result, without the per-request lists) and
``...-serve.png`` (output throughput and mean TPOT against concurrency per method).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import configs, serve_probe
from benchmarks.common import (DEFAULT_MODEL, REPO, cpu_dtype, load_prompts, machine_info,
                               repetition_share)
from benchmarks.load_clients import worker_set_budget_mode
from benchmarks.load_test import Row, Server
from vllm_anyorder import methods

CLI = Path(sys.executable).with_name("vllm-anyorder")
SERVED_NAME = "m"  # load_test.Server's --served-model-name
KEPT = ("completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
        "request_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms",
        "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
        "spec_decode_acceptance_length", "spec_decode_acceptance_rate")
BUILT_IN = {
    "none": lambda k: configs.no_spec(),
    "jacobi": lambda k: configs.jacobi(k),
    "ngram": lambda k: configs.ngram(k),
    "specdiff": lambda k: configs.specdiff(k, steps=max(1, k // 4)),
    "draft_model": lambda k: configs.draft_model(k),
}
PER_REQUEST = ("generated_texts", "ttfts", "itls", "errors", "input_lens", "output_lens",
               "start_times")  # --save-detailed lists, dropped from the stored raw result


def method_rows(methods: list[str], k: int, extra: list[list[str]]) -> dict[str, Row]:
    """Label -> server set-up, built-in methods first, then each ``--config``."""
    rows = {}
    for name in methods:
        if name not in BUILT_IN:
            raise SystemExit(f"unknown method {name!r}: one of {sorted(BUILT_IN)}, or use "
                             "--config LABEL SPEC_JSON [ADDITIONAL_JSON]")
        cfg = BUILT_IN[name](k)
        rows[name] = Row("target", cfg.speculative_config, cfg.additional_config or {})
    for item in extra:
        if len(item) not in (2, 3):
            raise SystemExit("--config takes LABEL SPEC_JSON [ADDITIONAL_JSON]")
        try:
            spec, more = json.loads(item[1]), json.loads(item[2]) if len(item) == 3 else {}
        except json.JSONDecodeError as exc:
            raise SystemExit(f"--config {item[0]}: not JSON: {exc}") from None
        rows[item[0]] = Row("target", spec or None, more)
    return rows


def write_prompts(path: Path, n: int, prompt_tokens: int) -> Path:
    """The benchmark prompts as vLLM's ``custom`` dataset (one ``{"prompt": ...}`` a line)."""
    with path.open("w") as f:
        for prompt in load_prompts(n, prompt_tokens):
            f.write(json.dumps({"prompt": prompt}) + "\n")
    return path


def client_command(args, base: str, dataset: str, prompts: Path, concurrency: int, rate: str,
                   result: Path) -> list[str]:
    """``vllm-anyorder bench serve`` for one point (vLLM's own flags)."""
    cmd = [str(CLI), "bench", "serve", "--backend", "openai", "--base-url", base,
           "--endpoint", "/v1/completions", "--model", str(args.model),
           "--served-model-name", SERVED_NAME, "--num-prompts", str(args.num_prompts),
           "--max-concurrency", str(concurrency), "--request-rate", rate, "--ignore-eos",
           "--temperature", str(args.temperature), "--seed", "0",
           "--num-warmups", str(args.warmups), "--percentile-metrics", "ttft,tpot,itl",
           "--disable-tqdm", "--save-result", "--save-detailed",
           "--result-dir", str(result.parent), "--result-filename", result.name]
    if dataset == "custom":
        return cmd + ["--dataset-name", "custom", "--dataset-path", str(prompts),
                      "--custom-output-len", str(args.max_tokens), "--skip-chat-template"]
    return cmd + ["--dataset-name", "random", "--random-input-len", str(args.prompt_tokens),
                  "--random-output-len", str(args.max_tokens)]


def text_repetition(texts: list[str], tokenizer) -> float:
    """Share of repeated 4-grams of the generated texts, in the model's tokens."""
    return round(repetition_share([tokenizer.encode(t, add_special_tokens=False)
                                   for t in texts]), 3)


def _runs(points: list[tuple], row: Row, modes: list[str], round_: int,
          passes: int = 1) -> list[tuple]:
    """(point, budget mode) of one server's client runs: each point once per mode and pass
    (the modes rotated by the round, so no mode always runs first on a fresh server, and
    reversed every other pass: A B B A, so each run of a mode has one of the other mode
    next to it); mode None: as started (no speculation, or no ``--modes``), once a pass."""
    if not modes or methods.lookup((row.spec or {}).get("method"), None) is None:
        return [(p, None) for _ in range(passes) for p in points]
    k = round_ % len(modes)
    order = modes[k:] + modes[:k]
    return [(p, m) for i in range(passes) for p in points
            for m in (order if i % 2 == 0 else order[::-1])]


def run_method(label: str, row: Row, args, workdir: Path, prompts: Path,
               round_: int = 0) -> list[dict]:
    points = [(d, c, r) for d in args.dataset for c in args.concurrency
              for r in args.request_rate]
    max_seqs = max(args.concurrency)
    t0 = time.time()
    # a KV cache for every concurrent request at full length, + one (vLLM keeps blocks aside)
    with Server(str(args.model), row, workdir / f"{label}.log", max_model_len=args.max_model_len,
                kv_tokens=(max_seqs + 1) * args.max_model_len, max_num_seqs=max_seqs,
                dtype=args.dtype) as server:
        startup_s = round(time.time() - t0, 1)
        rows = []
        for (dataset, concurrency, rate), mode in _runs(points, row, args.modes, round_,
                                                        args.passes):
            name = f"{label}@{mode}" if mode else label
            if mode:
                worker_set_budget_mode(server.base, mode)
            result = workdir / f"{name}-{dataset}-c{concurrency}-r{rate}.json"
            cmd = client_command(args, server.base, dataset, prompts, concurrency, rate, result)
            before = serve_probe.snapshot(server) if args.probe else None
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            if proc.returncode != 0 or not result.exists():
                raise RuntimeError(f"{label}: vllm bench serve failed ({proc.returncode}):\n"
                                   f"{' '.join(cmd)}\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
            raw = json.loads(result.read_text())
            probe = serve_probe.difference(before, serve_probe.snapshot(server),
                                           raw["total_output_tokens"]) if args.probe else None
            texts = raw.get("generated_texts") or []
            repeated = text_repetition(texts, args.tokenizer)
            raw = {k: v for k, v in raw.items() if k not in PER_REQUEST}
            rows.append({"method": name, "round": round_, "dataset": dataset,
                         "concurrency": concurrency,
                         "request_rate": rate, "temperature": args.temperature,
                         "startup_s": startup_s, **{k: raw.get(k) for k in KEPT},
                         "repetition_share": repeated, "outputs_sha1": hashlib.sha1(
                             json.dumps(texts).encode()).hexdigest(), "raw": raw,
                         **({"probe": probe} if probe else {})})
            print(f"{name:>12} {dataset:>6} c={concurrency:<3} rate={rate:<4} "
                  f"{raw['output_throughput']:8.1f} tok/s  TPOT {raw['mean_tpot_ms']:7.2f} ms"
                  f"  repeated 4-grams {repeated:.0%}", flush=True)
            if probe:
                print(f"{'':>12} per step: period {probe['period_ms']:.3f} ms, forward "
                      f"{probe['forward_ms']:.3f}, engine {probe['engine_ms']:.3f}, rows "
                      f"{probe['rows']:.2f} ({probe['draft_steps']:.1%} with drafts); CPU ms per "
                      f"token: {probe['cpu_ms_per_token']}", flush=True)
    return rows


def _by_round(runs: list[dict]) -> dict[int, list[dict]]:
    """Client runs grouped by server round, in run order."""
    out: dict[int, list[dict]] = {}
    for x in runs:
        out.setdefault(x["round"], []).append(x)
    return out


def print_ratios(rows: list[dict], base: str = "none") -> None:
    """Per method and point: the median output throughput and mean TPOT over its client runs
    (rounds x repeated values), as ratios to ``base``'s medians."""
    def key(r):
        return r["dataset"], r["concurrency"], r["request_rate"]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"],) + key(r), []).append(r)
    for (method, *point), rs in groups.items():
        ref = groups.get((base, *point))
        if method == base or not ref:
            continue
        tput, tpot = (statistics.median(x[f] for x in rs) / statistics.median(x[f] for x in ref)
                      for f in ("output_throughput", "mean_tpot_ms"))
        # paired: each run against the base's run of the same round and place in it (the
        # base's server was started just before this one), so server-instance spread that
        # lasts a round cancels
        ref_rounds = _by_round(ref)
        pairs = [(x, y) for rnd, xs in _by_round(rs).items()
                 for x, y in zip(xs, ref_rounds.get(rnd, []))]
        paired = ""
        if pairs:
            pt, pp = (statistics.median(x[f] / y[f] for x, y in pairs)
                      for f in ("output_throughput", "mean_tpot_ms"))
            paired = f" (paired {pt:.2f}x, {pp:.2f}x)"
        print(f"{method:>12} {point[0]:>6} c={point[1]:<3} rate={point[2]:<4} median of "
              f"{len(rs)} runs vs {base}: throughput {tput:.2f}x, mean TPOT {tpot:.2f}x"
              f"{paired}{in_forwards(rs, ref)}")


def in_forwards(runs: list[dict], ref: list[dict]) -> str:
    """With ``--probe``: a step's period counted in its own server's model forwards, against
    ``ref``'s (medians over client runs), and the rows per step of both. The forward of the
    same shapes moves by 10-25% between server instances on a 2-core VM, which no plugin code
    path can do; this ratio does not, so it resolves a floor of a few percent that wall-clock
    ratios over a handful of servers cannot. It compares engines only where both run the same
    rows per step (drafts off, or ``auto`` drafting almost nothing); a drafting row's longer
    forwards make it read low."""
    def split(rs):
        probes = [r["probe"] for r in rs if r.get("probe") and r["probe"].get("forward_ms")]
        if not probes:
            return None
        return (statistics.median(p["period_ms"] / p["forward_ms"] for p in probes),
                statistics.median(p.get("rows", 0.0) for p in probes))
    mine, base = split(runs), split(ref)
    if mine is None or base is None:
        return ""
    rows = f" (rows per step {mine[1]:.2f} vs {base[1]:.2f})" if mine[1] and base[1] else ""
    return f"; a step in forwards {mine[0] / base[0] - 1:+.1%}{rows}"


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--methods", default="none,jacobi,ngram",
                    help=f"comma-separated, of {', '.join(BUILT_IN)} ('': only --config rows)")
    ap.add_argument("--config", nargs="+", action="append", default=[],
                    metavar="LABEL SPEC_JSON [ADDITIONAL_JSON]",
                    help="an extra method: its --speculative-config (and --additional-config)")
    ap.add_argument("--k", type=int, default=16, help="drafts per step of the built-ins")
    ap.add_argument("--concurrency", default="1,4,8", help="vLLM's --max-concurrency values")
    ap.add_argument("--request-rate", default="inf", help="vLLM's --request-rate values "
                    "(requests/s, Poisson arrivals; inf: all at once)")
    ap.add_argument("--num-prompts", type=int, default=40)
    ap.add_argument("--dataset", default="custom", help="custom (the benchmark prompts as a "
                    "JSONL) and/or random (vLLM's random token ids), comma-separated")
    ap.add_argument("--prompt-tokens", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    ap.add_argument("--dtype", default=None, help="the servers' dtype (default: the CPU's "
                    "fast one; bf16 results depend on the batch's shape, so greedy texts of "
                    "two methods can differ at a near-tie: compare texts in float32)")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--warmups", type=int, default=2, help="vLLM's --num-warmups")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per client run")
    ap.add_argument("--rounds", type=int, default=1, help="servers per method, started in "
                    "rotation (none, jacobi, none, jacobi, ...): one server's ratio carries "
                    "the spread between server instances")
    ap.add_argument("--modes", default="", help="budget modes (auto, cycle:0, ...), "
                    "comma-separated by ';': each plugin method's server runs every point once "
                    "per mode, switched live (rows LABEL@MODE): compares modes without the "
                    "spread between server instances")
    ap.add_argument("--passes", type=int, default=1, help="client runs of each point and "
                    "mode per server, modes in A B B A order: on a 2-core VM one server's "
                    "forward drifts by up to 13%% between two 15-second runs, and a mode's "
                    "runs bracketed by the other's cancel a drift that lasts the passes")
    ap.add_argument("--probe", action="store_true", help="servers with the step-timing "
                    "patch; each run also records ms per step (period, forward, engine) and "
                    "each server process's CPU ms per token (benchmarks/serve_probe.py)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.request_rate = args.request_rate.split(",")
    args.dataset = args.dataset.split(",")
    args.modes = [m for m in args.modes.split(";") if m]
    if set(args.dataset) - {"custom", "random"}:
        ap.error(f"--dataset: custom and/or random, not {args.dataset}")
    return args


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    if args.probe:  # the servers inherit it (load_test.Server)
        os.environ["VLLM_ANYORDER_STEP_TIMING"] = "1"
    from transformers import AutoTokenizer

    args.tokenizer = AutoTokenizer.from_pretrained(str(args.model))
    rows = method_rows([m for m in args.methods.split(",") if m], args.k, args.config)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or REPO / "benchmarks" / "results" / f"serve-{stamp}.json"
    workdir = Path(tempfile.mkdtemp(prefix="bench_serve_"))
    prompts = write_prompts(workdir / "prompts.jsonl", args.num_prompts, args.prompt_tokens)
    report = {"model": str(args.model), "datasets": args.dataset, "machine": machine_info(),
              "dtype": args.dtype or "%s (%s)" % cpu_dtype(), "num_prompts": args.num_prompts,
              "max_tokens": args.max_tokens, "prompt_tokens": args.prompt_tokens,
              "temperature": args.temperature,
              "methods": {label: {"speculative_config": r.spec, "additional_config": r.extra}
                          for label, r in rows.items()}, "rows": []}
    for round_ in range(args.rounds):  # methods in rotation, one server alive at a time
        for label, row in rows.items():
            report["rows"] += run_method(label, row, args, workdir, prompts, round_)
    print_ratios(report["rows"])
    for label in rows if args.modes else ():  # each mode against the first, server by server
        mine = [r for r in report["rows"] if r["method"].startswith(f"{label}@")]
        if mine:
            print_ratios(mine, base=f"{label}@{args.modes[0]}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    from benchmarks.plots import write_serve_plot

    plot = write_serve_plot(report["rows"], out.with_suffix(""),
                            f"{args.model.name}, vLLM bench serve, {'/'.join(args.dataset)} "
                            f"prompts ({args.prompt_tokens} tokens), "
                            f"{args.max_tokens} tokens, T={args.temperature:g}, "
                            f"{report['dtype'].split()[0]}")
    print(f"wrote {out}\nwrote {plot}")
    return out


if __name__ == "__main__":
    main()
