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
        "recycle": "pool_first", "step_drafts": 0, "budget": "auto"}
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
    assert additional["anyorder"]["jacobi"]["block_size"] == 16
    assert resolved["num_speculative_tokens"] == 32  # 16 * 2


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


# --- vLLM's shorthand flags (--spec-method / --spec-model / --spec-tokens) ---

def engine_args(speculative_config=None, **flags):
    """The EngineArgs fields on_speculative_config reads (vLLM's own class is tested in
    tests/plugin/test_front_end_config.py)."""
    fields = {"spec_method": None, "spec_model": None, "spec_tokens": None, **flags}
    return NS(speculative_config=speculative_config, additional_config={}, **fields)


@pytest.mark.parametrize("flags,spec", [
    ({"spec_method": "jacobi", "spec_tokens": 8}, {"method": "jacobi", "num_speculative_tokens": 8}),
    ({"spec_model": PROPOSER, "spec_tokens": 8}, {"model": PROPOSER, "num_speculative_tokens": 8}),
    ({"spec_method": "assd"}, {"method": "assd"}),
])
def test_shorthand_flags_resolve_like_the_dict(flags, spec):
    by_flags, by_dict = engine_args(**flags), engine_args(dict(spec))
    target = model_config(["AnySubsetLlamaForCausalLM"], "anyorder_llama") \
        if flags.get("spec_method") == "assd" else AR
    engine_setup.on_speculative_config(by_flags, target)
    engine_setup.on_speculative_config(by_dict, target)
    assert by_flags.speculative_config["method"] == "custom_class"
    assert (by_flags.speculative_config, by_flags.additional_config) == \
        (by_dict.speculative_config, by_dict.additional_config)
    # consumed: vLLM's own merge, which runs after the hook, must not merge them again
    assert (by_flags.spec_method, by_flags.spec_model, by_flags.spec_tokens) == (None,) * 3


def test_shorthand_flags_complete_a_dict_without_mutating_it():
    user = {"method": "jacobi"}
    args = engine_args(user, spec_tokens=4)
    engine_setup.merge_shorthand(args)
    assert args.speculative_config == {"method": "jacobi", "num_speculative_tokens": 4}
    assert user == {"method": "jacobi"}


@pytest.mark.parametrize("spec,flags,flag", [
    ({"method": "ngram"}, {"spec_method": "jacobi"}, "--spec-method"),
    ({"num-speculative-tokens": 8}, {"spec_tokens": 8}, "--spec-tokens"),  # dash keys too
    ({"model": "x"}, {"spec_model": "y"}, "--spec-model"),
])
def test_a_flag_and_the_same_key_in_the_dict_are_mutually_exclusive(spec, flags, flag):
    """vLLM's own rule (engine/arg_utils.py create_speculative_config), also for its methods."""
    with pytest.raises(ValueError, match=f"{flag} and --speculative-config.*mutually exclusive"):
        engine_setup.on_speculative_config(engine_args(spec, **flags), AR)


def test_no_flags_leave_the_config_alone():
    args = engine_args(None)
    engine_setup.on_speculative_config(args, AR)
    assert args.speculative_config is None
    args = engine_args({"method": "ngram", "num_speculative_tokens": 3}, spec_tokens=None)
    engine_setup.on_speculative_config(args, AR)
    assert args.speculative_config == {"method": "ngram", "num_speculative_tokens": 3}


def test_shorthand_flags_are_validated_like_the_dict():
    with pytest.raises(AnyOrderConfigError, match="MAX_SPEC_LEN"):
        engine_setup.on_speculative_config(engine_args(spec_method="jacobi", spec_tokens=200), AR)


# --- the guard on the lossless promise (exactness.py) ---

LLADA = model_config(["LLaDAModelLM"], "llada")
ASARM = model_config(["AnySubsetLlamaForCausalLM"], "anyorder_llama")


@pytest.mark.parametrize("method,target", [
    ({"method": "jacobi", "num_speculative_tokens": 8}, AR),
    ({"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 8}, AR),
    ({"method": "assd", "num_speculative_tokens": 4}, ASARM),
    ({"method": "stepwise"}, LLADA),
    ({"method": "ssd"}, LLADA),
])
@pytest.mark.parametrize("setting,value,match", [
    ("rejection_sample_method", "synthetic", "made-up acceptance rates"),
    ("rejection_sample_method", "block", "V2 model runner"),
    ("rejection_sample_method", "fly", "lossy"),  # vLLM 0.33
    ("rejection_sample_method", "future_rule", "only 'standard' is known to be exact"),
    ("num_speculative_tokens_per_batch_size", [[1, 8, 2]], "dynamic speculative decoding"),
])
def test_inexact_verification_settings_are_refused(method, target, setting, value, match):
    with pytest.raises(AnyOrderConfigError) as err:
        engine_setup.resolve({**method, setting: value}, None, target)
    msg = str(err.value)
    assert f"speculative_config.{setting}={value!r}" in msg and match in msg
    name = method["method"] if method["method"] != "custom_class" else "jacobi"
    assert f"method '{name}'" in msg


@pytest.mark.parametrize("extra", [
    {}, {"rejection_sample_method": "standard"}, {"num_speculative_tokens_per_batch_size": None},
    # drafting-side settings: no effect on custom_class verification (docs/CONTRACTS.md)
    {"draft_sample_method": "probabilistic"}, {"disable_padded_drafter_batch": True},
])
def test_the_standard_rule_and_drafting_settings_pass(extra):
    resolved, _ = engine_setup.resolve({"method": "jacobi", "num_speculative_tokens": 8, **extra},
                                       None, AR)
    assert resolved["method"] == "custom_class"
    assert {k: resolved[k] for k in extra} == extra


def test_vllms_own_methods_are_not_guarded():
    spec = {"method": "ngram", "num_speculative_tokens": 4, "rejection_sample_method": "synthetic",
            "synthetic_acceptance_length": 2.0}
    assert engine_setup.resolve(dict(spec), None, AR) == (spec, None)
