"""Load, fault and bad-input test of ``vllm-anyorder serve`` for every method (loopback only).

Per method: start the server (small KV cache, so concurrent requests get preempted) with the
diagnostics worker extension; run ``rounds`` rounds of ``requests`` concurrent streaming /
non-streaming requests (mixed prompt lengths, ``max_tokens``, temperatures, stop strings);
between rounds inject faults (clients that disconnect mid-stream, cancelled requests,
requests longer than ``max_model_len``) and send bad input; after each round sample the RSS
of the server's process tree and the proposers' per-request containers (after one probe
request, so that vLLM drops finished requests from the batch). Greedy texts are compared
with a no-speculation server on the same model. Bounded: every request has a timeout and
the servers are stopped at the end.

    python -m benchmarks.load_test --out benchmarks/results/load.json     # full size
    python -m benchmarks.load_test --size small --methods jacobi          # quick

Methods and models come from ``ROWS`` (add a row for a new method).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from benchmarks import load_clients as lc
from benchmarks.common import cpu_dtype, machine_info

REPO = Path(__file__).resolve().parents[1]
EXTENSION = "vllm_anyorder.diagnostics.AnyorderWorkerExtension"
SIZES = {"small": dict(requests=12, rounds=2, concurrency=6, max_tokens=24, faults=2),
         "full": dict(requests=48, rounds=4, concurrency=16, max_tokens=64, faults=4)}


@dataclass(frozen=True)
class Row:
    target: str  # key into the models dict
    spec: dict | None  # speculative_config (None: the no-speculation reference)
    extra: dict = field(default_factory=dict)


def rows(models: dict[str, str]) -> dict[str, Row]:
    """Method -> server set-up. ``models``: ar (AR target), mdlm (its drafter), asarm, dllm
    (a LLaDA / Dream checkpoint)."""
    return {
        "jacobi": Row("ar", {"method": "jacobi", "num_speculative_tokens": 8},
                      {"anyorder": {"jacobi": {"num_blocks": 2}}}),
        "specdiff": Row("ar", {"method": "specdiff", "model": models["mdlm"],
                               "num_speculative_tokens": 8},
                        {"anyorder": {"specdiff": {"steps": 2}}}),
        "assd": Row("asarm", {"method": "assd", "num_speculative_tokens": 4}),
        # diffusion LLM: its reference server (no speculative config) runs `stepwise` with
        # the default block options, so these rows keep the defaults too
        "ssd": Row("dllm", {"method": "ssd", "num_speculative_tokens": 3},
                   {"anyorder": {"ssd": {"mix_order": True}}}),
        "freedave": Row("dllm", {"method": "freedave", "num_speculative_tokens": 4}),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kv_bytes_for(model: str, tokens: int, dtype: str = "float32") -> int:
    """KV-cache bytes that hold ``tokens`` tokens of ``model`` in ``dtype`` (the serving
    dtype: the cache's entries have its size; bf16 holds twice the tokens of fp32)."""
    cfg = json.loads((Path(model) / "config.json").read_text())
    heads = cfg.get("num_attention_heads") or cfg["n_heads"]  # HF names, or LLaDA's
    head_dim = cfg.get("head_dim") or (cfg.get("hidden_size") or cfg["d_model"]) // heads
    kv_heads = cfg.get("num_key_value_heads") or cfg.get("n_kv_heads") or heads
    layers = cfg.get("num_hidden_layers") or cfg["n_layers"]
    width = 4 if dtype in ("float32", "float") else 2
    return 2 * layers * kv_heads * head_dim * width * tokens


class Server:
    """``vllm-anyorder serve`` in a subprocess (context manager). ``kv_tokens``: KV-cache size
    in tokens (a little above ``max_model_len`` forces preemption under concurrency)."""

    def __init__(self, model: str, row: Row, log: Path, *, max_model_len: int, kv_tokens: int,
                 max_num_seqs: int, dtype: str | None = None):
        dtype = dtype or cpu_dtype()[0]  # default: the CPU's fast dtype
        kv_bytes = kv_bytes_for(model, kv_tokens, dtype)
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cli = Path(sys.executable).with_name("vllm-anyorder")
        self.cmd = [str(cli), "serve", model, "--host", "127.0.0.1", "--port", str(self.port),
                    "--served-model-name", lc.MODEL, "--enforce-eager", "--dtype", dtype,
                    "--max-model-len", str(max_model_len), "--kv-cache-memory-bytes",
                    str(kv_bytes), "--max-num-seqs", str(max_num_seqs), "--seed", "0",
                    "--worker-extension-cls", EXTENSION]
        if row.spec is not None:
            self.cmd += ["--speculative-config", json.dumps(row.spec)]
        if row.extra:
            self.cmd += ["--additional-config", json.dumps(row.extra)]
        self.log = log

    def __enter__(self) -> "Server":
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
        self._fh = open(self.log, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self._fh, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 600
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.__exit__()
                raise RuntimeError("server exited:\n" + self.log.read_text()[-3000:])
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    self.children = {p.pid for p in self.tree()}
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.__exit__()
        raise RuntimeError("server did not start:\n" + self.log.read_text()[-3000:])

    def __exit__(self, *exc) -> None:
        """Stop the server, then any process of its tree that outlived it."""
        try:
            tree = self.tree()[1:]
        except psutil.Error:
            tree = []
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        _, alive = psutil.wait_procs(tree, timeout=30)
        for p in alive:
            p.kill()
        self._fh.close()

    def tree(self) -> list[psutil.Process]:
        root = psutil.Process(self.proc.pid)
        return [root, *root.children(recursive=True)]

    def rss_mb(self) -> float:
        return sum(p.memory_info().rss for p in self.tree()) / 2 ** 20

    def rss_by_process(self) -> dict[str, float]:
        """RSS (MB) per process of the tree, by process title (APIServer, EngineCore, ...)."""
        out: dict[str, float] = {}
        for p in self.tree():
            name = f"{p.name()}[{p.pid}]"
            out[name] = round(p.memory_info().rss / 2 ** 20, 1)
        return out

    def alive(self) -> bool:
        """The server and every process it had at start-up still run, and /health is 200."""
        if self.proc.poll() is not None or not self.children <= {p.pid for p in self.tree()}:
            return False
        return httpx.get(self.base + "/health", timeout=10).status_code == 200


def _prompts(models: dict[str, str], target: str) -> list[str]:
    if models.get("prompts"):
        return json.loads(Path(models["prompts"]).read_text())
    sys.path.insert(0, str(REPO))
    from training.data import benchmark_prompts

    return benchmark_prompts(24, 64)


def _settle(server: Server, timeout: float = 60) -> None:
    """Wait until the engine has no running / waiting requests (aborts have landed)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if lc.metric(server.base, "vllm:num_requests_running") == 0 and \
                lc.metric(server.base, "vllm:num_requests_waiting") == 0:
            return
        time.sleep(0.5)


def _probe_state(server: Server, prompt: str) -> list[dict]:
    httpx.post(server.base + "/v1/completions", json={"model": lc.MODEL, "prompt": prompt,
                                                      "max_tokens": 2}, timeout=120)
    return lc.worker_state(server.base)


def run_method(method: str, models: dict[str, str], size: dict, workdir: Path,
               reference: dict[int, str] | None, seed: int = 0, **server_kw) -> dict:
    row = rows(models)[method] if method != "reference" else Row(models["_ref_target"], None)
    prompts = _prompts(models, row.target)
    rounds = [lc.workload(seed + r, prompts, size["requests"], size["max_tokens"])
              for r in range(size["rounds"])]
    too_long = "a b " * (2 * server_kw["max_model_len"])
    rep = {"method": method, "requests": 0, "errors": [], "divergences": [], "rounds": [],
           "faults": [], "bad_input": {}, "preemptions": 0}
    rep["loadavg_before"] = [round(x, 2) for x in os.getloadavg()]
    t0 = time.time()
    with Server(models[row.target], row, workdir / f"{method}.log", **server_kw) as srv:
        rep["startup_s"] = round(time.time() - t0, 1)
        texts = {}
        for r, reqs in enumerate(rounds):
            results, secs = asyncio.run(lc.run_round(srv.base, reqs, size["concurrency"]))
            rep["requests"] += len(results)
            for res in results:
                if not res.ok:
                    rep["errors"].append({"round": r, "key": res.key, "status": res.status,
                                          "error": res.error})
                if res.greedy:
                    texts[r * 10 ** 6 + res.key] = res.text
            long_tokens = server_kw["max_model_len"] // 2
            if r == 0:  # KV-cache pressure: compared with the reference like the rounds
                # twice the cache in all: three requests that together just overflow it dodge
                # preemption when speculation lets one run far ahead and finish before the
                # others grow (jacobi, CI of 2026-11-28: 0 preemptions)
                n = min(server_kw["max_num_seqs"],
                        max(3, -(-2 * server_kw["kv_tokens"] // long_tokens)))
                for i, text in enumerate(asyncio.run(lc.pressure(srv.base, prompts[0][:24],
                                                                 long_tokens, n))):
                    texts[-1 - i] = text
            if method != "reference":
                rep["faults"].append(asyncio.run(lc.faults(
                    srv.base, prompts[0][:24], too_long, size["faults"], long_tokens)))
            _settle(srv)
            state = _probe_state(srv, prompts[0][:8])
            rep["rounds"].append({"seconds": round(secs, 1), "rss_mb": round(srv.rss_mb(), 1),
                                  "rss_by_process": srv.rss_by_process(),
                                  "containers": [s["containers"] for s in state],
                                  "worker_memory": lc.worker_memory(srv.base),
                                  "alive": srv.alive()})
        if method != "reference":
            rep["bad_input"] = asyncio.run(lc.send_bad_inputs(srv.base, prompts[0][:16]))
        rep["after_bad_input_alive"] = srv.alive()
        rep["preemptions"] = lc.metric(srv.base, "vllm:num_preemptions_total")
        final = lc.worker_state(srv.base)[0]
        rep["platform"], rep["proposer"] = final["platform"], final["method"]
    rep["seconds"] = round(time.time() - t0, 1)
    rep["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    rep["servers_alive_max"] = 1  # run_all runs one server at a time (context manager)
    rep["greedy_requests"] = len(texts)
    if reference is not None:
        rep["divergences"] = [k for k, text in texts.items() if reference.get(k) != text]
    rep["texts"] = texts
    return rep


def verdict(rep: dict) -> list[str]:
    """What failed in one method's report (empty = pass)."""
    bad = []
    if rep["errors"]:
        bad.append(f"{len(rep['errors'])} failed requests")
    if rep["divergences"]:
        bad.append(f"{len(rep['divergences'])} greedy divergences")
    if not all(r["alive"] for r in rep["rounds"]) or not rep.get("after_bad_input_alive"):
        bad.append("a server process died or /health failed")
    accepted = [k for k, status in rep["bad_input"].items() if not 400 <= status < 500]
    if accepted:
        bad.append(f"bad input not refused with 4xx: {accepted}")
    for f in rep["faults"]:
        if any(not 400 <= s < 500 for s in f["too_long_status"]):
            bad.append(f"over-long request not refused: {f['too_long_status']}")
    for r in rep["rounds"]:  # after the probe request, per-request dicts hold <= 1 entry
        for ranks in r["containers"]:
            if any(v > 1 for k, v in ranks.items() if k not in ("finished",)):
                bad.append(f"per-request state not released: {ranks}")
    mem = [r["worker_memory"] for r in rep["rounds"] if r.get("worker_memory")]
    if len(mem) >= 3:  # a leak of live objects (what per-request state would be)
        for rank, (second, last) in enumerate(zip(mem[1], mem[-1])):
            if last["tensor_mb"] - second["tensor_mb"] > 1.0:
                bad.append(f"rank {rank}: live tensors grew {second['tensor_mb']} -> "
                           f"{last['tensor_mb']} MB after warm-up")
            if last["python_objects"] > 1.02 * second["python_objects"]:
                bad.append(f"rank {rank}: Python objects grew {second['python_objects']} -> "
                           f"{last['python_objects']} after warm-up")
    rss = [r["rss_mb"] for r in rep["rounds"]]
    if len(rss) >= 3 and rss[-1] - rss[1] > max(64.0, 0.05 * rss[1]):
        bad.append(f"RSS grew {rss[1]} -> {rss[-1]} MB after warm-up")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default="jacobi,specdiff,assd,ssd,freedave")
    ap.add_argument("--size", choices=sorted(SIZES), default="full")
    ap.add_argument("--ar", default=str(REPO / "models" / "ar-target"))
    ap.add_argument("--mdlm", default=str(REPO / "models" / "mdlm-drafter"))
    ap.add_argument("--asarm", default="", help="AS-ARM dir (default: a tiny random one)")
    ap.add_argument("--dllm", default=str(REPO / "models" / "llada-dllm"))
    ap.add_argument("--prompts", default="", help="JSON list of prompts (default: benchmark split)")
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--kv-tokens", type=int, default=768, help="KV cache size in tokens")
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=0, help="override the size's rounds")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="load_"))
    models = {"ar": args.ar, "mdlm": args.mdlm, "asarm": args.asarm, "dllm": args.dllm,
              "prompts": args.prompts}
    if not models["asarm"]:
        sys.path.insert(0, str(REPO / "tests"))
        from asarm_models import build_tiny_asarm

        models["asarm"] = str(build_tiny_asarm(workdir / "asarm", vocab_size=64))
    size = {**SIZES[args.size], **({"rounds": args.rounds} if args.rounds else {})}
    report = run_all(args.methods.split(","), models, size, workdir,
                     max_model_len=args.max_model_len, kv_tokens=args.kv_tokens,
                     max_num_seqs=args.max_num_seqs)
    report["machine"] = {**machine_info(), "memory_gib": psutil.virtual_memory().total >> 30}
    report["dtype"] = "%s (%s)" % cpu_dtype()
    print(json.dumps({m: {**r, "texts": len(r["texts"])} for m, r in report["methods"].items()},
                     indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 1 if any(r["verdict"] for r in report["methods"].values()) else 0


def run_all(methods: list[str], models: dict[str, str], size: dict, workdir: Path,
            **server_kw) -> dict:
    """Reference server per target model, then every method; {"methods": {m: report}}."""
    table, refs, out = rows(models), {}, {}
    for method in methods:
        target = table[method].target
        if target not in refs:
            ref = run_method("reference", {**models, "_ref_target": target}, size, workdir,
                             None, **server_kw)
            refs[target] = ref["texts"]
            out[f"reference[{target}]"] = {**ref, "verdict": verdict(ref)}
        rep = run_method(method, models, size, workdir, refs[target], **server_kw)
        out[method] = {**rep, "verdict": verdict(rep)}
    return {"methods": out, "size": size, "server": server_kw}


if __name__ == "__main__":
    sys.exit(main())
