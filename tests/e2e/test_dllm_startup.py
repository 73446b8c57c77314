"""Bad dLLM deployments fail in the front-end process, before any engine process starts:
a dLLM method on an autoregressive model, an AR method or a vLLM built-in method on a diffusion
model, block length / N / d out of range, options vLLM's fields carry."""

import multiprocessing

import pytest

from e2e.conftest import make_llm

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def llada(tmp_path_factory):
    from tiny_models import build_tiny_dllm

    return build_tiny_dllm(tmp_path_factory.mktemp("llada"), "llada")


@pytest.mark.parametrize("spec,extra,match", [
    ({"method": "jacobi", "num_speculative_tokens": 8}, None, "autoregressive target"),
    ({"method": "specdiff", "model": "/x", "num_speculative_tokens": 8}, None,
     "autoregressive target"),
    ({"method": "assd", "num_speculative_tokens": 4}, None, "autoregressive target"),
    ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}, None,
     "cannot serve the diffusion model"),
    ({"method": "ssd", "num_speculative_tokens": 0}, None, "positive integer"),
    ({"method": "ssd", "num_speculative_tokens": 40}, None, "draft_length"),
    ({"method": "freedave", "num_speculative_tokens": 4},
     {"anyorder": {"freedave": {"block_length": 1}}}, "block_length"),
    ({"method": "freedave", "num_speculative_tokens": 4},
     {"anyorder": {"freedave": {"block_length": 300}}}, "block_length"),
    ({"method": "ssd", "num_speculative_tokens": 3},
     {"anyorder": {"ssd": {"block_length": 8, "steps_per_block": 9}}}, "steps_per_block"),
    ({"method": "ssd", "num_speculative_tokens": 3},
     {"anyorder": {"ssd": {"draft_length": 3}}}, "speculative config"),
    ({"method": "stepwise", "num_speculative_tokens": 3}, None, "takes no num_speculative"),
    (None, {"anyorder": {"stepwise": {"remasking": "lowest"}}}, "remasking"),
])
def test_bad_dllm_config_fails_at_start_up(llada, spec, extra, match):
    before = len(multiprocessing.active_children())
    with pytest.raises(ValueError, match=match):
        make_llm(llada, speculative_config=spec, additional_config=extra, max_model_len=128,
                 max_num_batched_tokens=128)
    assert len(multiprocessing.active_children()) == before  # nothing half-started


@pytest.mark.parametrize("method", ["ssd", "freedave", "stepwise"])
def test_dllm_method_on_an_autoregressive_model_is_refused(tiny_llama, method):
    spec = {"method": method} if method == "stepwise" else \
        {"method": method, "num_speculative_tokens": 3}
    with pytest.raises(ValueError, match="needs a diffusion target"):
        make_llm(tiny_llama, speculative_config=spec)


def test_prompt_must_fit_one_prefill(llada):
    with pytest.raises(ValueError, match="prefilled in one step"):
        make_llm(llada, max_model_len=256, max_num_batched_tokens=64)


def test_an_fp8_kv_cache_is_refused(llada):
    with pytest.raises(ValueError, match="fp8 KV cache"):
        make_llm(llada, kv_cache_dtype="fp8")
