"""The front end on vLLM's real config path (``EngineArgs.create_engine_config``, no engine
started): vLLM's shorthand flags give the same resolved config as ``--speculative-config``
(through ``LLM``-style keyword arguments and through vLLM's own CLI parser), a lossy
verification setting is refused, and the model-runner decision for the plugin's models and
methods (on this CPU, and with Triton pretended present, as on every GPU install).
One fresh interpreter runs every case (vLLM's import dominates: ~15 s)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import json, os, sys
    from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    import vllm.config.vllm as vllm_config_module

    llama, asarm, llada = sys.argv[1:4]
    KW = dict(dtype="float32", max_model_len=256, enforce_eager=True)
    out = {}

    def summary(**kw):
        cfg = EngineArgs(**{**KW, **kw}).create_engine_config()
        spec = cfg.speculative_config
        return {"spec": spec and [spec.method, spec.model, spec.num_speculative_tokens],
                "additional": cfg.additional_config, "v2": cfg.use_v2_model_runner,
                "unsupported": cfg._get_v2_model_runner_unsupported_features()}

    def error(**kw):
        try:
            EngineArgs(**{**KW, **kw}).create_engine_config()
        except ValueError as exc:
            return str(exc)
        return None

    out["dict"] = summary(model=llama, speculative_config={"method": "jacobi",
                                                           "num_speculative_tokens": 8})
    out["kwargs"] = summary(model=llama, spec_method="jacobi", spec_tokens=8)
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    cli = parser.parse_args(["--model", llama, "--dtype", "float32", "--max-model-len", "256",
                             "--enforce-eager", "--spec-method", "jacobi", "--spec-tokens", "8"])
    cfg = AsyncEngineArgs.from_cli_args(cli).create_engine_config()
    out["cli"] = [[cfg.speculative_config.method, cfg.speculative_config.model,
                   cfg.speculative_config.num_speculative_tokens], cfg.additional_config]
    out["both"] = error(model=llama, spec_method="jacobi",
                        speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    out["block"] = error(model=llama, spec_tokens=8, speculative_config={
        "method": "jacobi", "rejection_sample_method": "block"})
    out["cpu_asarm"] = summary(model=asarm)
    vllm_config_module.HAS_TRITON = True  # what every GPU install has
    out["gpu_llama"] = summary(model=llama)
    out["gpu_asarm"] = summary(model=asarm)
    out["gpu_llada"] = summary(model=llada)
    out["gpu_jacobi"] = summary(model=llama, spec_method="jacobi", spec_tokens=8)
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    out["forced_llama"] = summary(model=llama)["v2"]
    out["forced_asarm"] = error(model=asarm)
    out["forced_jacobi"] = error(model=llama, spec_method="jacobi", spec_tokens=8)
    print(json.dumps(out))
''')


@pytest.fixture(scope="module")
def results(tiny_llama, tmp_path_factory):
    from asarm_models import build_tiny_asarm
    from tiny_models import build_tiny_dllm

    asarm = build_tiny_asarm(tmp_path_factory.mktemp("asarm_cfg"))
    llada = build_tiny_dllm(tmp_path_factory.mktemp("llada_cfg"), "llada")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_USE_V2_MODEL_RUNNER"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_llama), str(asarm), str(llada)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_shorthand_kwargs_resolve_like_the_dict(results):
    assert results["dict"]["spec"] == [
        "custom_class", "vllm_anyorder.proposers.jacobi.JacobiProposer", 16]  # n*K
    assert results["kwargs"] == results["dict"]


def test_shorthand_cli_flags_resolve_like_the_dict(results):
    assert results["cli"] == [results["dict"]["spec"], results["dict"]["additional"]]


def test_a_flag_and_the_dict_key_clash_by_vllms_rule(results):
    assert "--spec-method and --speculative-config['method'] are mutually exclusive" in \
        results["both"]


def test_lossy_verification_is_refused_on_the_real_path(results):
    assert "rejection_sample_method='block' is refused for method 'jacobi'" in results["block"]


def test_plugin_models_run_on_v1_also_where_triton_exists(results):
    assert results["gpu_llama"]["v2"] is True  # vLLM's default there: the V2 runner
    for key, arch in (("gpu_asarm", "AnySubsetLlamaForCausalLM"), ("gpu_llada", "LLaDAModelLM"),
                      ("cpu_asarm", "AnySubsetLlamaForCausalLM")):
        assert results[key]["v2"] is False, key
        assert f"vllm-anyorder's {arch} models" in results[key]["unsupported"], key
    assert results["gpu_llada"]["spec"][0] == "custom_class"  # stepwise by default
    assert results["gpu_jacobi"]["v2"] is False


def test_forcing_v2_on_the_plugin_fails_at_start_up(results):
    assert results["forced_llama"] is True  # forcing V2 alone is not refused
    for key, what in (("forced_asarm", "AnySubsetLlamaForCausalLM models"),
                      ("forced_jacobi", "method 'jacobi'")):
        assert what in results[key] and "VLLM_USE_V2_MODEL_RUNNER=1" in results[key], key
