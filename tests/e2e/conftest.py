"""End-to-end helpers: vLLM engines on tiny checkpoints, shared per module (start-up ~20 s)."""

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
