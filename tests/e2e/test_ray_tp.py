"""Tensor parallel 2 over Ray (``distributed_executor_backend="ray"``) on CPU, every method.

One local Ray head on loopback (``ray start --head --block``, token auth, 2 CPUs) serves all
rows. Per method: greedy outputs equal the single-process run without speculation; both
workers are Ray actors in which the plugin's ``register()`` ran and which use the plugin's CPU
platform; after a sampled batch (temperature 1, n=2) the proposers on the two ranks hold the
same per-request state (``diagnostics.AnyorderWorkerExtension.anyorder_state``).

Adding a method: add a row to ``METHODS`` (the model fixture name, the speculative config and
``additional_config``); the model must shard over TP=2 (KV heads divisible by 2).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from e2e.conftest import make_llm, shutdown

pytestmark = [pytest.mark.e2e, pytest.mark.serial]  # TP ranks: a core each
ray = pytest.importorskip("ray", reason="Ray tests need the 'ray' extra (pip install .[ray])")

PROMPTS = ["abc", "hello world", "klmnop\nab", "def f(x):", "zz", "ghij kl"]
EXTENSION = "vllm_anyorder.diagnostics.AnyorderWorkerExtension"


@dataclass(frozen=True)
class Row:
    model: str  # fixture name of the target checkpoint
    spec: dict  # speculative_config; "{drafter}" fixture names are resolved below
    extra: dict = field(default_factory=dict)  # additional_config
    fixtures: tuple[str, ...] = ()  # fixtures substituted into spec values "{name}"
    ref_extra: dict = field(default_factory=dict)  # additional_config of the reference run


METHODS = {
    "jacobi": Row("cyclic_llama", {"method": "jacobi", "num_speculative_tokens": 8},
                  {"anyorder": {"jacobi": {"num_blocks": 2}}}),
    "specdiff": Row("cyclic_llama", {"method": "specdiff", "model": "{cyclic_drafter}",
                                     "num_speculative_tokens": 8},
                    {"anyorder": {"specdiff": {"steps": 4, "schedule": "random",
                                               "temperature": 1.0, "seed": 3}}},
                    fixtures=("cyclic_drafter",)),
    "assd": Row("asarm_kv2", {"method": "assd", "num_speculative_tokens": 4},
                {"anyorder": {"assd": {"drafter": "self"}}}),
    # diffusion LLM: the single-process run without speculation is its `stepwise` baseline
    "ssd": Row("llada_kv2", {"method": "ssd", "num_speculative_tokens": 3},
               {"anyorder": {"ssd": {"block_length": 8, "mix_order": True}}},
               ref_extra={"anyorder": {"stepwise": {"block_length": 8}}}),
    "freedave": Row("llada_kv2", {"method": "freedave", "num_speculative_tokens": 4},
                    {"anyorder": {"freedave": {"block_length": 8}}},
                    ref_extra={"anyorder": {"stepwise": {"block_length": 8}}}),
}


@pytest.fixture(scope="module")
def llada_kv2(tmp_path_factory):
    from tiny_models import build_tiny_dllm

    return build_tiny_dllm(tmp_path_factory.mktemp("llada_ray"), "llada", seed=6)


@pytest.fixture(scope="module")
def asarm_kv2(tmp_path_factory):
    from asarm_models import build_tiny_asarm

    return build_tiny_asarm(tmp_path_factory.mktemp("asarm_ray"), vocab_size=64, kv_heads=2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head():
    """A local Ray head on 127.0.0.1 for this module; the engine connects via RAY_ADDRESS."""
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths are long
    port = _free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "VLLM_CPU_OMP_THREADS_BIND": "0|1", "RAY_USAGE_STATS_ENABLED": "0"}
    ray_cli = Path(sys.executable).with_name("ray")
    cmd = [str(ray_cli), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
           f"--port={port}", f"--ray-client-server-port={_free_port()}",
           f"--dashboard-agent-listen-port={_free_port()}", "--num-cpus=2", "--num-gpus=0",
           "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"]
    log = open(Path(temp) / "head.log", "w")
    t0 = time.time()
    head = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    address = f"127.0.0.1:{port}"
    try:
        while time.time() - t0 < 120:
            if head.poll() is not None:
                pytest.fail("ray head exited:\n" + (Path(temp) / "head.log").read_text()[-3000:])
            if "will now block" in (Path(temp) / "head.log").read_text():
                break
            time.sleep(0.5)
        else:
            pytest.fail("ray head did not start")
        yield {"RAY_ADDRESS": address, **{k: env[k] for k in
                                          ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN",
                                           "VLLM_CPU_OMP_THREADS_BIND")}}
    finally:
        head.terminate()  # `ray start --block` stops the processes it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def single_process():
    """Greedy outputs of the single-process engine without speculation, per model."""
    return {}


def _greedy(llm):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params, use_tqdm=False)]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _start_over_ray(model, spec: dict, extra: dict):
    """The TP=2 engine over Ray. One retry when its EngineCore dies during start-up: in CI on
    2026-11-28 (specdiff) it died after both Ray workers had joined, the root cause cut from
    the log; the same test passed locally right after, every method. A failure that
    repeats still fails the test; the retry is reported as a warning."""
    kwargs = dict(tensor_parallel_size=2, distributed_executor_backend="ray",
                  worker_extension_cls=EXTENSION, speculative_config=spec,
                  additional_config=extra)
    try:
        return make_llm(model, **kwargs)
    except RuntimeError as err:
        if "Engine core initialization failed" not in str(err):
            raise
        warnings.warn(f"TP=2 over Ray: engine start-up failed once, retried: {err}")
        time.sleep(5)  # the dead engine's actors leave the cluster
        return make_llm(model, **kwargs)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_tp2_over_ray_equals_single_process(method, ray_head, single_process, request,
                                            monkeypatch):
    from vllm import SamplingParams

    row = METHODS[method]
    model = request.getfixturevalue(row.model)
    subs = {f"{{{name}}}": str(request.getfixturevalue(name)) for name in row.fixtures}
    spec = {k: subs.get(v, v) if isinstance(v, str) else v for k, v in row.spec.items()}
    ref_key = (row.model, repr(row.ref_extra))
    if ref_key not in single_process:
        llm = make_llm(model, **({"additional_config": row.ref_extra} if row.ref_extra else {}))
        try:
            single_process[ref_key] = _greedy(llm)
        finally:
            shutdown(llm)
    for key, value in ray_head.items():
        monkeypatch.setenv(key, value)
    llm = _start_over_ray(model, spec, row.extra)
    try:
        got = _greedy(llm)
        sampled = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, n=2, seed=None)
        llm.generate(PROMPTS, sampled, use_tqdm=False)
        states = llm.collective_rpc("anyorder_state")
        titles = [_cmdline(s["pid"]) for s in states]  # while the actors are alive
    finally:
        shutdown(llm)
    assert got == single_process[ref_key]
    assert [s["rank"] for s in states] == [0, 1]
    for s, title in zip(states, titles):  # register() ran inside each Ray worker actor
        assert s["registered"] and s["platform"] == "AnyorderCpuPlatform", s
        assert s["method"] == method, s
        assert s["pid"] != os.getpid() and title.startswith("ray::"), (s, title)
    assert states[0]["pid"] != states[1]["pid"]
    # the same per-request state on both ranks (keys of per-request dicts, integer counters)
    assert states[0]["fingerprint"] == states[1]["fingerprint"], states
    assert states[0]["containers"] == states[1]["containers"], states
    # the same speculation budget: rank 0's step times shared, the same decisions
    assert states[0]["budget"] == states[1]["budget"], states
