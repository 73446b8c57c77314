"""runner_choice + patch ``v1_model_runner``: the plugin's models and methods get vLLM's V1
model runner (the one its runner hooks target), and forcing V2 on them fails at start-up.
Fake configs and a fake ``VllmConfig`` class with vLLM's decision order (env, HiSparse /
watermark, Triton, unsupported features) stand in for vLLM here; the real ``VllmConfig`` on
this CPU, with Triton pretended present as on a GPU, is checked in
tests/plugin/test_front_end_config.py."""

from types import SimpleNamespace as NS

import pytest

from vllm_anyorder import _compat, patches, runner_choice
from vllm_anyorder.patches import front_end


def config(architectures=("LlamaForCausalLM",), spec=None, watermark=None, hisparse=None):
    return NS(model_config=NS(hf_config=NS(architectures=list(architectures))),
              speculative_config=spec, watermark_config=watermark,
              attention_config=NS(hisparse_config=hisparse))


JACOBI = NS(method="custom_class", model="vllm_anyorder.proposers.jacobi.JacobiProposer")


@pytest.mark.parametrize("cfg,expected", [
    (config(["AnySubsetLlamaForCausalLM"]), "AnySubsetLlamaForCausalLM"),
    (config(["XLNetLMHeadModel"]), "XLNetLMHeadModel"),
    (config(["LLaDAModelLM"]), "LLaDAModelLM"),
    (config(["DreamModel"]), "DreamModel"),
    (config(spec=JACOBI), "method 'jacobi'"),
    (config(spec=NS(method="jacobi", model=None)), "method 'jacobi'"),
])
def test_plugin_models_and_methods_need_v1(cfg, expected):
    assert expected in runner_choice.needs_v1(cfg)


@pytest.mark.parametrize("cfg", [
    config(), config(spec=NS(method="ngram", model="ngram")),
    config(spec=NS(method="custom_class", model="my.own.Proposer")), NS(model_config=None),
])
def test_other_configurations_do_not(cfg):
    assert runner_choice.needs_v1(cfg) is None


class FakeVllmConfig:
    """vLLM 0.32's ``use_v2_model_runner`` decision order, over plain attributes."""

    def __init__(self, cfg, env=None, triton=True):
        self.__dict__.update(vars(cfg))
        self.env, self.triton = env, triton

    @property
    def use_v2_model_runner(self):
        if self.attention_config.hisparse_config is not None or self.watermark_config:
            return True
        if self.env is not None:
            return self.env
        return self.triton and not self._get_v2_model_runner_unsupported_features()

    def _get_v2_model_runner_unsupported_features(self):
        spec = self.speculative_config
        return [f"speculative method '{spec.method}'"] \
            if spec is not None and spec.method == "custom_class" else []


@pytest.fixture
def patched(monkeypatch):
    cls = type("PatchedVllmConfig", (FakeVllmConfig,), {})
    monkeypatch.setattr(_compat, "vllm_config_cls", lambda: cls)
    front_end.apply_v1_model_runner(runner_choice.needs_v1, runner_choice.forced_v2_message)
    return cls


@pytest.mark.parametrize("architectures", ["AnySubsetLlamaForCausalLM", "XLNetLMHeadModel",
                                           "LLaDAModelLM", "DreamModel"])
def test_a_plugin_model_without_speculation_selects_v1_on_a_gpu(patched, architectures):
    assert FakeVllmConfig(config([architectures])).use_v2_model_runner  # unpatched: V2
    cfg = patched(config([architectures]))
    assert cfg.use_v2_model_runner is False
    assert architectures in cfg._get_v2_model_runner_unsupported_features()[-1]


def test_other_models_keep_vllms_choice(patched):
    assert patched(config()).use_v2_model_runner is True
    assert patched(config(), triton=False).use_v2_model_runner is False
    assert patched(config(), env=False).use_v2_model_runner is False
    assert patched(config(["LLaDAModelLM"]), env=False).use_v2_model_runner is False


@pytest.mark.parametrize("cfg,forced_by", [
    (config(["AnySubsetLlamaForCausalLM"]), "VLLM_USE_V2_MODEL_RUNNER=1"),
    (config(spec=JACOBI), "VLLM_USE_V2_MODEL_RUNNER=1"),
    (config(["LLaDAModelLM"], watermark=NS()), "a watermark config"),
    (config(spec=JACOBI, hisparse=NS()), "a HiSparse attention config"),
])
def test_forcing_v2_on_the_plugin_is_refused(patched, monkeypatch, cfg, forced_by):
    env = forced_by.startswith("VLLM")
    if env:
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    else:
        monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    with pytest.raises(ValueError, match="only vLLM's V1 model runner") as err:
        patched(cfg, env=True if env else None).use_v2_model_runner
    assert forced_by in str(err.value)
    assert patched(config(), env=True if env else None).use_v2_model_runner is True


def test_the_patch_is_in_the_ledger():
    row = patches.BY_NAME["v1_model_runner"]
    assert row.install is front_end.apply_v1_model_runner
    assert set(row.needs) == {"needs_v1", "forced_v2_message"}
