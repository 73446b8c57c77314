"""End-to-end helpers: vLLM engines on tiny checkpoints, shared per module (start-up ~20 s)."""

import contextlib
import gc
import os

import pytest

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# tests inspect worker state with collective_rpc(function): needs pickle transport
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

ENGINE_DEFAULTS = dict(
    enforce_eager=True,
    dtype="float32",
    max_model_len=512,
    kv_cache_memory_bytes=1 << 28,
    disable_log_stats=False,
    seed=0,
)


def make_llm(model, **overrides):
    from vllm import LLM

    return LLM(str(model), **{**ENGINE_DEFAULTS, **overrides})


def shutdown(llm):
    """Stop an engine's processes. Engines on vLLM's mp executor are killed at once (SIGTERM,
    then the process tree killed without vLLM's 5 s grace: their graceful exit takes ~5 s
    here; the suite ran 4.5 min faster, and tests read nothing after it); a Ray-backed engine shuts
    down gracefully, so its actors leave the Ray cluster for the next engine."""
    try:
        backend = llm.llm_engine.vllm_config.parallel_config.distributed_executor_backend
    except AttributeError:  # not a config we know: vLLM's graceful shutdown
        backend = "unknown"
    try:
        llm.llm_engine.engine_core.shutdown(**({"timeout": 0} if backend == "mp" else {}))
    except Exception:
        pass
    del llm
    gc.collect()


def spec_metrics(llm) -> dict:
    """vLLM's own spec-decode counters (vllm:spec_decode_*) as a dict."""
    out = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            out[m.name] = getattr(m, "values", None) or getattr(m, "value", None)
    return out


@pytest.fixture(scope="module")
def engines():
    """Module-scoped registry of engines, shut down at module end."""
    made = {}
    yield made
    for llm in made.values():
        shutdown(llm)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(model, args: list[str], log, timeout: float = 240):
    """``vllm-anyorder serve <model> <args>`` on a free loopback port; yields the base URL
    once /health answers (fails the test with the log's tail if it exits or never starts);
    terminates the server afterwards."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    import requests

    port = free_port()
    cli = Path(sys.executable).with_name("vllm-anyorder")
    cmd = [str(cli), "serve", str(model), "--host", "127.0.0.1", "--port", str(port), *args]
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"})
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail("server exited:\n" + Path(log).read_text()[-4000:])
        try:
            if requests.get(base + "/health", timeout=2).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        time.sleep(1)
    else:
        proc.kill()
        pytest.fail("server did not start:\n" + Path(log).read_text()[-4000:])
    try:
        yield base
    finally:
        stop(proc, 30)


def stop(proc, timeout: float) -> None:
    """Terminate a server process; kill it if it has not exited after ``timeout`` s."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()


def other_attention(kind: str) -> str:
    """The attention implementation ``auto`` does NOT pick on this CPU for ``kind``: the key
    equality tests run again on it (``test_*_other_attention.py``); the full matrix runs on
    the one ``auto`` picks."""
    from vllm_anyorder.attention_backends.selection import AUTO_ON_CPU

    return "torch" if AUTO_ON_CPU[kind] == "cpu_op" else "cpu_op"


@contextlib.contextmanager
def attention_env(value: str):
    """``VLLM_ANYORDER_ATTENTION`` for the engines started inside (their workers read it)."""
    old = os.environ.get("VLLM_ANYORDER_ATTENTION")
    os.environ["VLLM_ANYORDER_ATTENTION"] = value
    try:
        yield value
    finally:
        if old is None:
            os.environ.pop("VLLM_ANYORDER_ATTENTION", None)
        else:
            os.environ["VLLM_ANYORDER_ATTENTION"] = old


def other_attention_fixture(kind: str, before=None):
    """A module-scoped autouse fixture: the module's engines run the implementation ``auto``
    does not pick for ``kind`` (``before()`` runs first, e.g. to clear shared records)."""
    @pytest.fixture(scope="module", autouse=True)
    def _other_attention():
        if before is not None:
            before()
        with attention_env(other_attention(kind)):
            yield

    return _other_attention


def attention_impls(llm) -> list[list[str]]:
    """The attention implementation (``torch`` / ``cpu_op``) of the model's attention layers,
    read from each rank's impl classes."""
    names = {"TorchPagedImpl": "torch", "CPUAttentionBackendImpl": "cpu_op"}

    def read(worker):
        from vllm.model_executor.layers.attention import Attention

        return sorted({type(m.impl).__name__ for m in worker.model_runner.model.modules()
                       if isinstance(m, Attention)})

    return [[names.get(c, c) for c in rank] for rank in llm.collective_rpc(read)]
