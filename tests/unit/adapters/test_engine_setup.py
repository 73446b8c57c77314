"""engine_setup.resolve: plugin methods are validated and mapped onto vLLM's custom_class
hook at start-up; everything else passes through. A fake model config stands in for
vLLM's ModelConfig (resolve only reads hf_config.architectures / model_type, runner_type
and model), so no vLLM import and no engine."""

import copy
from types import SimpleNamespace as NS

import pytest

from vllm_anyorder import config, engine_setup
from vllm_anyorder.config import AnyOrderConfigError, JacobiConfig

PROPOSER = "vllm_anyorder.proposers.jacobi.JacobiProposer"


def model_config(architectures=("LlamaForCausalLM",), model_type="llama", runner_type="generate"):
    return NS(hf_config=NS(architectures=list(architectures), model_type=model_type),
              runner_type=runner_type, model="x")


AR = model_config()


def test_jacobi_is_rewritten_to_the_custom_class_hook():
    spec = {"method": "jacobi", "num_speculative_tokens": 8}
    resolved, additional = engine_setup.resolve(
        spec, {"anyorder": {"jacobi": {"num_blocks": 3}}}, AR)
    # engine verifies n*K drafts per step; the block size stays in the plugin's options
    assert resolved == {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 24}
    assert additional["anyorder"]["resolved"] == "jacobi"
    assert additional["anyorder"]["jacobi"] == {
        "block_size": 8, "num_blocks": 3, "pool_size": 4, "spawn_ratio": 0.85,
        "recycle": "pool_first", "step_drafts": 0}
    # what the workers will read back
    assert config.load(additional, "jacobi", block_size=24) == JacobiConfig(block_size=8,
                                                                            num_blocks=3)


def test_chain_length_is_capped_at_128():
    resolved, additional = engine_setup.resolve(
        {"method": "jacobi", "num_speculative_tokens": 100}, None, AR)
    assert resolved["num_speculative_tokens"] == 128
    assert additional["anyorder"]["jacobi"]["block_size"] == 100


def test_missing_num_speculative_tokens_takes_the_default_block_size():
    resolved, additional = engine_setup.resolve({"method": "jacobi"}, None, AR)
    assert additional["anyorder"]["jacobi"]["block_size"] == 64
    assert resolved["num_speculative_tokens"] == 128  # 64 * 2


def test_other_speculative_fields_are_kept():
    resolved, _ = engine_setup.resolve(
        {"method": "jacobi", "num_speculative_tokens": 4, "disable_by_batch_size": 8}, None, AR)
    assert resolved["disable_by_batch_size"] == 8


def test_custom_class_with_our_class_path_is_handled_like_jacobi():
    extra = {"anyorder": {"jacobi": {"pool_size": 2}}}
    by_name = engine_setup.resolve({"method": "jacobi", "num_speculative_tokens": 8}, extra, AR)
    by_path = engine_setup.resolve(
        {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 8}, extra, AR)
    assert by_path == by_name
    assert by_path[1]["anyorder"]["jacobi"]["pool_size"] == 2


def test_custom_class_with_our_class_path_is_validated_too():
    with pytest.raises(AnyOrderConfigError, match="num_blocks"):
        engine_setup.resolve(
            {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 8},
            {"anyorder": {"jacobi": {"num_blocks": 0}}}, AR)


@pytest.mark.parametrize("spec", [
    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3},
    {"method": "draft_model", "model": "some/draft", "num_speculative_tokens": 3},
    {"method": "custom_class", "model": "my.own.Proposer", "num_speculative_tokens": 3},
])
def test_other_methods_pass_through_unchanged(spec):
    additional = {"anyorder": {"jacobbi": {}}, "other": 1}  # would be refused for jacobi
    before = copy.deepcopy(additional)
    resolved, out = engine_setup.resolve(dict(spec), additional, AR)
    assert resolved == spec
    assert out is additional and additional == before


def test_vllm_methods_are_refused_on_a_diffusion_target():
    """A dLLM decodes only through the plugin's dLLM methods; vLLM's own would run it as an
    autoregressive model."""
    llada = model_config(["LLaDAModelLM"], "llada")
    spec = {"method": "ngram", "num_speculative_tokens": 4}
    with pytest.raises(AnyOrderConfigError, match="cannot serve the diffusion model"):
        engine_setup.resolve(spec, None, llada)
    assert engine_setup.resolve(spec, None, AR) == (spec, None)


def test_a_diffusion_target_without_speculative_config_gets_stepwise():
    llada = model_config(["LLaDAModelLM"], "llada")
    assert engine_setup.default_spec(llada) == {"method": "stepwise"}
    assert engine_setup.default_spec(AR) is None
    resolved, extra = engine_setup.resolve({"method": "stepwise"}, None, llada)
    assert resolved["method"] == "custom_class" and resolved["num_speculative_tokens"] == 31
    assert extra["anyorder"]["resolved"] == "stepwise"


def test_dash_keys_are_normalised():
    resolved, _ = engine_setup.resolve({"method": "jacobi", "num-speculative-tokens": 8}, None, AR)
    assert resolved == {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 16}
    # also for methods that are not ours
    resolved, _ = engine_setup.resolve({"method": "ngram", "prompt-lookup-max": 3}, None, AR)
    assert resolved == {"method": "ngram", "prompt_lookup_max": 3}


@pytest.mark.parametrize("architectures,model_type", [
    (["LLaDAModelLM"], "llada"),
    (["DreamModel"], "dream"),
    (["SomethingElse"], "llada"),  # model_type alone is enough
    (["SomethingElse"], "LLaDA"),  # case-insensitive
    (["LlamaForCausalLM", "DreamModel"], "llama"),  # any listed architecture
])
def test_diffusion_targets_are_refused(architectures, model_type):
    with pytest.raises(AnyOrderConfigError) as err:
        engine_setup.resolve({"method": "jacobi", "num_speculative_tokens": 8}, None,
                             model_config(architectures, model_type))
    msg = str(err.value)
    assert "'jacobi'" in msg and "autoregressive" in msg and "diffusion" in msg


def test_missing_hf_config_counts_as_autoregressive():
    mc = NS(runner_type="generate", model="x")
    resolved, _ = engine_setup.resolve({"method": "jacobi", "num_speculative_tokens": 4}, None, mc)
    assert resolved["method"] == "custom_class"


def test_pooling_runner_is_refused():
    with pytest.raises(AnyOrderConfigError, match=r"generative.*'pooling'"):
        engine_setup.resolve({"method": "jacobi", "num_speculative_tokens": 8}, None,
                             model_config(runner_type="pooling"))


@pytest.mark.parametrize("k,match", [
    (129, "MAX_SPEC_LEN"),
    (0, "positive integer"),
    (-3, "positive integer"),
    ("8", "positive integer"),
    (8.0, "positive integer"),
    (True, "positive integer"),
])
def test_bad_num_speculative_tokens_is_refused(k, match):
    with pytest.raises(AnyOrderConfigError, match=match):
        engine_setup.resolve({"method": "jacobi", "num_speculative_tokens": k}, None, AR)


def test_unknown_key_in_the_anyorder_section_is_refused():
    with pytest.raises(AnyOrderConfigError, match=r"unknown key.*jacobbi"):
        engine_setup.resolve({"method": "jacobi", "num_speculative_tokens": 8},
                             {"anyorder": {"jacobbi": {"num_blocks": 2}}}, AR)


def test_unknown_option_and_block_size_clash_are_refused():
    spec = {"method": "jacobi", "num_speculative_tokens": 8}
    with pytest.raises(AnyOrderConfigError, match="unknown option"):
        engine_setup.resolve(spec, {"anyorder": {"jacobi": {"blocks": 2}}}, AR)
    with pytest.raises(AnyOrderConfigError, match="block_size"):
        engine_setup.resolve(spec, {"anyorder": {"jacobi": {"block_size": 8}}}, AR)
    with pytest.raises(AnyOrderConfigError, match="JSON object"):
        engine_setup.resolve(spec, {"anyorder": {"jacobi": [1, 2]}}, AR)


def test_the_users_dicts_are_not_mutated():
    spec = {"method": "jacobi", "num-speculative-tokens": 8}
    additional = {"anyorder": {"jacobi": {"num_blocks": 3}}, "other": {"a": [1]}}
    spec_before, additional_before = copy.deepcopy(spec), copy.deepcopy(additional)
    resolved, out = engine_setup.resolve(spec, additional, AR)
    assert spec == spec_before and additional == additional_before
    assert out is not additional and out["other"] == {"a": [1]}
    out["other"]["a"].append(2)  # a deep copy: the user's nested values are not shared
    assert additional["other"] == {"a": [1]}


def test_resolving_twice_gives_the_same_result():
    once = engine_setup.resolve({"method": "jacobi", "num_speculative_tokens": 8}, None, AR)
    assert engine_setup.resolve(*once, AR) == once
