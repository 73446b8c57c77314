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
    try:
        llm.llm_engine.engine_core.shutdown()
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
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
