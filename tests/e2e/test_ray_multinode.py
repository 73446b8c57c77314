"""Tensor parallel 2 over Ray across two nodes (two network namespaces on this machine).

The README's multi-node recipe, run as written: a Ray head and a worker node (``ray start
--address``), one CPU each, token auth, each in its own network namespace (joined by a veth
pair whose addresses exist only there) with its own ``/dev/shm``; ``vllm-anyorder serve
--tensor-parallel-size 2 --distributed-executor-backend ray`` on the head with RAY_ADDRESS,
so rank 0 runs on the head and rank 1 on the worker node (gloo over TCP between them).

* ``jacobi`` on ``models/ar-target`` and ``ssd`` on ``models/llada-dllm``: greedy token ids
  over HTTP equal the single-process run (no speculation; ``stepwise`` for the dLLM).
* A fault: the worker node's processes are killed (what ``ray stop --force`` does to them)
  while a streamed request is generating; the stream must end with an error (or the
  connection close) within a bound, the server must exit (vLLM's engine is dead), and a new
  server started after the node returns serves correctly (the ``ssd`` test, which brings the
  node back if it is down).

Skipped where Linux network namespaces cannot be made (not root, no iproute2). Every
namespace and process the module made is removed at its end (``netns_ray.TwoNodeRay``).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e.conftest import make_llm, shutdown, stop
from netns_ray import WORKER_IP, TwoNodeRay, unavailable

pytestmark = [pytest.mark.e2e, pytest.mark.serial]  # TP ranks: a core each
pytest.importorskip("ray", reason="Ray tests need the 'ray' extra (pip install .[ray])")

ROOT = Path(__file__).resolve().parents[2]
AR_TARGET, DLLM = ROOT / "models" / "ar-target", ROOT / "models" / "llada-dllm"
PROMPTS = ["abc", "hello world", "def f(x):"]
ENGINE = ["--enforce-eager", "--dtype", "float32", "--max-model-len", "512",
          "--kv-cache-memory-bytes", str(1 << 28), "--seed", "0", "--served-model-name", "m",
          "--tensor-parallel-size", "2", "--distributed-executor-backend", "ray"]
FAULT_BOUND_S = 120  # the stream must end this soon after the worker node is killed


@pytest.fixture(scope="module")
def cluster():
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    nodes = TwoNodeRay()
    try:
        nodes.create()
        nodes.start("head")
        nodes.start("worker")
        yield nodes
    finally:
        nodes.close()


def _single_process(model: Path, extra: dict | None, max_tokens: int) -> list[list[int]]:
    from vllm import SamplingParams

    llm = make_llm(model, **({"additional_config": extra} if extra else {}))
    try:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params,
                                                                   use_tqdm=False)]
    finally:
        shutdown(llm)


def _completion(base: str, **fields) -> list[str]:
    body = {"model": "m", "temperature": 0, "ignore_eos": True, **fields}
    return [f"{base}/v1/completions", "-H", "Content-Type: application/json",
            "-d", json.dumps(body)]


@contextlib.contextmanager
def _server(nodes: TwoNodeRay, model: Path, args: list[str], log: Path, timeout: float = 300):
    """``vllm-anyorder serve`` on the head node; yields (base URL, process)."""
    port = subprocess.run(nodes.head_cmd(sys.executable, "-c", (
        "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); "
        "print(s.getsockname()[1])")), capture_output=True, text=True, check=True).stdout.strip()
    cli = str(Path(sys.executable).with_name("vllm-anyorder"))
    with open(log, "w") as fh:
        proc = subprocess.Popen(nodes.head_cmd(cli, "serve", str(model), "--host", "127.0.0.1",
                                               "--port", port, *ENGINE, *args),
                                stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**nodes.driver_env(), "VLLM_LOGGING_LEVEL": "WARNING"})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while nodes.curl("-o", "/dev/null", "-w", "%{http_code}", base + "/health",
                         timeout=5).stdout != "200":
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail("server did not start:\n" + log.read_text()[-4000:])
            time.sleep(1)
        yield base, proc
    finally:
        stop(proc, 60)


def _greedy_over_http(nodes: TwoNodeRay, base: str, max_tokens: int) -> list[list[int]]:
    out = nodes.curl(*_completion(base, prompt=PROMPTS, max_tokens=max_tokens,
                                  return_token_ids=True))
    assert out.returncode == 0, out.stderr
    choices = sorted(json.loads(out.stdout)["choices"], key=lambda c: c["index"])
    return [c["token_ids"] for c in choices]


def _events(lines: list[str]) -> list[dict]:
    return [json.loads(x[6:]) for x in lines if x.startswith("data: {")]


def test_jacobi_across_nodes_then_the_worker_node_dies(cluster, tmp_path):
    want = _single_process(AR_TARGET, None, 32)
    spec = {"method": "jacobi", "num_speculative_tokens": 8}
    with _server(cluster, AR_TARGET, ["--speculative-config", json.dumps(spec)],
                 tmp_path / "jacobi.log") as (base, server):
        assert _greedy_over_http(cluster, base, 32) == want
        # a long streamed request; kill the worker node once tokens are flowing
        stream = subprocess.Popen(cluster.head_cmd("curl", "-sS", "-N", "-m", "600",
                                                   *_completion(base, prompt="abc",
                                                                max_tokens=480, stream=True)),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        before = []
        while len(_events(before)) < 5:
            line = stream.stdout.readline()
            assert line, "stream ended before the fault: " + "".join(before)
            before.append(line.strip())
        killed_at = cluster.kill("worker")
        try:
            after = stream.communicate(timeout=FAULT_BOUND_S)[0].splitlines()
        except subprocess.TimeoutExpired:
            stream.kill()
            pytest.fail(f"client still waiting {FAULT_BOUND_S} s after the worker node died")
        ended_after = time.time() - killed_at
        events = _events(after)
        finished = [c["finish_reason"] for e in events for c in e.get("choices", [])]
        errors = [e["error"]["message"] for e in events if "error" in e]
        assert "length" not in finished, "the request completed: the fault came too late"
        assert errors or stream.returncode != 0, after  # an error event, or the connection closed
        assert ended_after < FAULT_BOUND_S
        # the engine is dead: the server exits rather than accepting requests it cannot serve
        try:
            server.wait(timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail("server still up after its engine died:\n"
                        + (tmp_path / "jacobi.log").read_text()[-3000:])
        again = cluster.curl(*_completion(base, prompt="abc", max_tokens=4), timeout=30)
        assert again.returncode != 0, again.stdout  # refused, not left hanging
    # the server's log names the cause: gloo lost rank 1's node (connection reset / closed
    # by peer [WORKER_IP]), or Ray reported the rank-1 actor dead
    log = (tmp_path / "jacobi.log").read_text()
    assert f"[{WORKER_IP}]" in log or "died unexpectedly" in log, log[-3000:]


def test_dllm_across_nodes_on_a_new_server_after_the_node_returns(cluster, tmp_path):
    want = _single_process(DLLM, {"anyorder": {"stepwise": {"block_length": 8}}}, 16)
    if "worker" not in cluster.nodes:  # killed by the fault test: the node comes back
        cluster.start("worker")
    spec = {"method": "ssd", "num_speculative_tokens": 3}
    extra = {"anyorder": {"ssd": {"block_length": 8, "mix_order": True}}}
    with _server(cluster, DLLM, ["--speculative-config", json.dumps(spec),
                                 "--additional-config", json.dumps(extra)],
                 tmp_path / "ssd.log") as (base, _):
        assert _greedy_over_http(cluster, base, 16) == want
