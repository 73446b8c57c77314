"""Registration and engine settings of the AS-ARM model classes (``anyorder_llama``, XLNet).

``register()`` (called from the plugin's ``register()`` in every vLLM process) makes vLLM
load ``anyorder_llama`` checkpoints (transformers' ``AutoConfig`` learns the model type, the
architecture maps lazily to ``asarm_vllm:AnySubsetLlamaForCausalLM``) and XLNet checkpoints
(``XLNetLMHeadModel`` -> ``xlnet_vllm:XLNetAnySubsetLM``, served as AS-ARMs), and vLLM's
per-architecture config hook table gets :class:`AsArmEngineConfig`, which runs in the
front-end process while the engine config is built (before any engine process starts).

Kept light: importing this module imports neither torch nor vLLM.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("vllm_anyorder")

MODEL_CLASSES = {  # architecture -> vLLM model class
    "AnySubsetLlamaForCausalLM":  # == model_executor.asarm.ARCHITECTURE
        "vllm_anyorder.model_executor.asarm_vllm:AnySubsetLlamaForCausalLM",
    "XLNetLMHeadModel": "vllm_anyorder.model_executor.xlnet_vllm:XLNetAnySubsetLM",
}
ARCHITECTURES = tuple(MODEL_CLASSES)


class AsArmEngineConfig:
    """Engine settings an AS-ARM needs (vLLM's ``MODELS_CONFIG_MAP`` hook protocol).

    The prompt is attended bidirectionally, so it must be prefilled in one step (chunked
    prefill off) and its KV cannot be shared with another prompt (prefix caching off): a
    prompt block's K/V depend on every prompt token, also the later ones."""

    @staticmethod
    def verify_and_update_model_config(model_config) -> None:
        return

    @staticmethod
    def verify_and_update_config(vllm_config) -> None:
        bidirectional_prompt_settings(
            vllm_config, "AnySubsetLlamaForCausalLM (anyorder_llama)", "an AS-ARM prompt")


class XLNetEngineConfig(AsArmEngineConfig):
    """The AS-ARM settings, plus the XLNet options this engine implements: bidirectional
    relative attention (``attn_type="bi"``) without ``bi_data`` (a pre-training option)."""

    @staticmethod
    def verify_and_update_config(vllm_config) -> None:
        hf = vllm_config.model_config.hf_config
        if getattr(hf, "attn_type", "bi") != "bi" or getattr(hf, "bi_data", False):
            raise ValueError(
                f"XLNetLMHeadModel as an AS-ARM needs attn_type='bi' and bi_data=False "
                f"(got attn_type={getattr(hf, 'attn_type', None)!r}, "
                f"bi_data={getattr(hf, 'bi_data', None)!r})")
        bidirectional_prompt_settings(vllm_config, "XLNetLMHeadModel (AS-ARM)",
                                      "an AS-ARM prompt")


def bidirectional_prompt_settings(vllm_config, model_name: str, prompt_kind: str) -> None:
    """Engine settings of a model whose prompt is attended bidirectionally (AS-ARMs, dLLMs):
    CPU attention backend only; the prompt is prefilled in one step (chunked prefill off,
    ``max_num_batched_tokens >= max_model_len``) and its KV are never shared with another
    prompt (prefix caching off)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        raise ValueError(f"{model_name} runs on vLLM's CPU attention backend only in this "
                         f"version of vllm-anyorder")
    cache, sched = vllm_config.cache_config, vllm_config.scheduler_config
    max_len = vllm_config.model_config.max_model_len
    if sched.max_num_batched_tokens < max_len:
        raise ValueError(
            f"{prompt_kind} is attended bidirectionally and must be prefilled in one "
            f"step: max_num_batched_tokens ({sched.max_num_batched_tokens}) must be >= "
            f"max_model_len ({max_len}); raise it or lower max_model_len")
    if cache.enable_prefix_caching or sched.enable_chunked_prefill:
        logger.info("vllm_anyorder: %s: prefix caching and chunked prefill disabled (the "
                    "prompt is attended bidirectionally)", model_name)
    cache.enable_prefix_caching = False
    sched.enable_chunked_prefill = False


ENGINE_CONFIGS = {  # architecture -> vLLM MODELS_CONFIG_MAP hook
    "AnySubsetLlamaForCausalLM": AsArmEngineConfig,
    "XLNetLMHeadModel": XLNetEngineConfig,
}


def register() -> None:
    """Make vLLM (and transformers' AutoConfig) load AS-ARM checkpoints (both formats)."""
    from vllm import ModelRegistry

    from vllm_anyorder import _compat
    from vllm_anyorder.model_executor import asarm_hf_config, xlnet_hf_config

    asarm_hf_config.register()
    xlnet_hf_config.register()
    hooks = _compat.models_config_map()
    for arch, model_class in MODEL_CLASSES.items():
        if arch not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(arch, model_class)
        hooks.setdefault(arch, ENGINE_CONFIGS[arch])


def is_asarm(hf_config) -> bool:
    """Whether a Hugging Face config describes an AS-ARM checkpoint vLLM can serve."""
    archs = set(getattr(hf_config, "architectures", None) or [])
    return bool(archs & set(ARCHITECTURES)) or \
        getattr(hf_config, "model_type", None) == "anyorder_llama"


def check_assd_target(cfg, target_model_config) -> None:
    """Start-up check of ``method="assd"`` (front-end, before any engine process): the target
    must be an AS-ARM, because ASSD drafts with the model's query stream."""
    from vllm_anyorder.config import AnyOrderConfigError

    hf = getattr(target_model_config, "hf_config", None)
    if not is_asarm(hf):
        raise AnyOrderConfigError(
            f"method 'assd' needs an any-subset autoregressive (AS-ARM) target: it drafts "
            f"with the model's query stream. {getattr(target_model_config, 'model', '?')!r} "
            f"has architectures {getattr(hf, 'architectures', None)} (model_type "
            f"{getattr(hf, 'model_type', None)!r}); expected one of {list(ARCHITECTURES)}")
    if cfg.drafter == "self" and cfg.k == 2:
        logger.warning(
            "vllm_anyorder: assd with k=2: Guo & Ermon advise k > 2 (a round of two "
            "forwards commits 2 tokens for sure; here up to 3 with vLLM's bonus token)")
