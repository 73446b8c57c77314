"""`assd` and the AS-ARM model refuse bad set-ups in the front-end process, before any engine
process starts, with a message that names the problem; the AS-ARM's engine settings
(prefill in one step, no prefix caching) are applied when the engine config is built."""

import multiprocessing

import pytest

from e2e.conftest import ENGINE_DEFAULTS, make_llm

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def asarm(tmp_path_factory):
    from asarm_models import build_tiny_asarm

    return build_tiny_asarm(tmp_path_factory.mktemp("asarm_startup"), vocab_size=64)


def _refused(model, match, **kw):
    before = len(multiprocessing.active_children())
    with pytest.raises(ValueError, match=match):
        make_llm(model, **kw)
    assert len(multiprocessing.active_children()) == before  # nothing half-started


def test_assd_on_a_plain_llama_is_refused(tiny_llama):
    _refused(tiny_llama, "AS-ARM", speculative_config={"method": "assd",
                                                       "num_speculative_tokens": 4})


@pytest.mark.parametrize("spec,extra,match", [
    ({"method": "assd", "num_speculative_tokens": 1}, {"anyorder": {"assd": {"drafter": "self"}}}, "k = 1"),
    ({"method": "assd", "num_speculative_tokens": 200}, None, "MAX_SPEC_LEN"),
    ({"method": "assd", "num_speculative_tokens": 4},
     {"anyorder": {"assd": {"drafter": "bigram"}}}, "drafter"),
    ({"method": "assd", "num_speculative_tokens": 4},
     {"anyorder": {"assd": {"k": 3}}}, "speculative config"),
    ({"method": "assd", "num_speculative_tokens": 4},
     {"anyorder": {"assd": {"window": 3}}}, "unknown option"),
])
def test_bad_assd_options_are_refused(asarm, spec, extra, match):
    _refused(asarm, match, speculative_config=spec, additional_config=extra or {})


def test_an_asarm_prompt_must_fit_one_prefill(asarm):
    _refused(asarm, "prefilled in one step", max_model_len=512, max_num_batched_tokens=256)


def test_an_fp8_kv_cache_is_refused(asarm):
    _refused(asarm, "fp8 KV cache", kv_cache_dtype="fp8")


def test_asarm_engine_settings_override_prefix_caching_and_chunked_prefill(asarm):
    from vllm.engine.arg_utils import EngineArgs

    kw = {k: v for k, v in ENGINE_DEFAULTS.items() if k != "disable_log_stats"}
    cfg = EngineArgs(model=str(asarm), enable_prefix_caching=True, enable_chunked_prefill=True,
                     **kw).create_engine_config()
    assert cfg.cache_config.enable_prefix_caching is False
    assert cfg.scheduler_config.enable_chunked_prefill is False
    assert cfg.model_config.architecture == "AnySubsetLlamaForCausalLM"


@pytest.fixture(scope="module")
def xlnet(tmp_path_factory):
    from asarm_models import build_tiny_xlnet

    return build_tiny_xlnet(tmp_path_factory.mktemp("xlnet_startup"), vocab_size=64)


def _xlnet_variant(xlnet, tmp_path, **changes):
    import json
    import shutil

    path = tmp_path / "variant"
    shutil.copytree(xlnet, path)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, **changes}))
    return path


@pytest.mark.parametrize("changes,match", [
    ({"attn_type": "uni"}, "attn_type='bi'"),
    ({"bi_data": True}, "bi_data=False"),
])
def test_xlnet_options_the_engine_does_not_implement_are_refused(xlnet, tmp_path, changes,
                                                                  match):
    _refused(_xlnet_variant(xlnet, tmp_path, **changes), match)


def test_xlnet_length_limit_comes_from_the_config(xlnet, tmp_path):
    """transformers' XLNetConfig says -1 (no limit), which vLLM cannot use: the plugin's
    config class answers 512 (XLNet's pre-training length) or config.json's
    ``max_position_embeddings``."""
    from vllm.engine.arg_utils import EngineArgs

    kw = {k: v for k, v in ENGINE_DEFAULTS.items()
          if k not in ("disable_log_stats", "max_model_len")}
    cfg = EngineArgs(model=str(xlnet), **kw).create_engine_config()
    assert cfg.model_config.max_model_len == 512
    assert cfg.model_config.architecture == "XLNetLMHeadModel"
    assert cfg.cache_config.enable_prefix_caching is False
    longer = _xlnet_variant(xlnet, tmp_path, max_position_embeddings=1024)
    cfg = EngineArgs(model=str(longer), max_num_batched_tokens=1024, **kw).create_engine_config()
    assert cfg.model_config.max_model_len == 1024
    _refused(xlnet, "max_model_len", max_model_len=1024, max_num_batched_tokens=1024)
