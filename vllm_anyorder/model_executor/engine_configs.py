"""Engine settings of the families the plugin serves: vLLM's per-architecture
``MODELS_CONFIG_MAP`` hooks (``families.FAMILIES``' ``engine_config`` column).

vLLM calls a hook in the front-end process while the engine config is built, before any
engine process starts. Every family here attends its prompt bidirectionally (AS-ARMs, dLLMs):
it must be prefilled in one step (chunked prefill off) and its KV cannot be shared with
another prompt (prefix caching off): a prompt block's K/V depend on every prompt token, also
the later ones. Imports neither torch nor vLLM at module level.
"""

from __future__ import annotations

import logging
from typing import ClassVar

logger = logging.getLogger("vllm_anyorder")


class BidirectionalPromptEngineConfig:
    """The ``MODELS_CONFIG_MAP`` hook protocol for a model whose prompt is bidirectional."""

    MODEL_NAME: ClassVar[str] = ""
    PROMPT_KIND: ClassVar[str] = ""
    ATTENTION_KIND: ClassVar[str] = ""  # a kind of ``attention_backends.selection``

    @staticmethod
    def verify_and_update_model_config(model_config) -> None:
        return

    @classmethod
    def verify_and_update_config(cls, vllm_config) -> None:
        bidirectional_prompt_settings(vllm_config, cls.MODEL_NAME, cls.PROMPT_KIND)
        plugin_attention_settings(vllm_config, cls.MODEL_NAME, cls.ATTENTION_KIND)


class AsArmEngineConfig(BidirectionalPromptEngineConfig):
    MODEL_NAME = "AnySubsetLlamaForCausalLM (anyorder_llama)"
    PROMPT_KIND = "an AS-ARM prompt"
    ATTENTION_KIND = "asarm"


class XLNetEngineConfig(BidirectionalPromptEngineConfig):
    """The AS-ARM settings, plus the XLNet options this engine implements: bidirectional
    relative attention (``attn_type="bi"``) without ``bi_data`` (a pre-training option)."""

    MODEL_NAME = "XLNetLMHeadModel (AS-ARM)"
    PROMPT_KIND = "an AS-ARM prompt"
    ATTENTION_KIND = "xlnet"

    @classmethod
    def verify_and_update_config(cls, vllm_config) -> None:
        hf = vllm_config.model_config.hf_config
        if getattr(hf, "attn_type", "bi") != "bi" or getattr(hf, "bi_data", False):
            raise ValueError(
                f"XLNetLMHeadModel as an AS-ARM needs attn_type='bi' and bi_data=False "
                f"(got attn_type={getattr(hf, 'attn_type', None)!r}, "
                f"bi_data={getattr(hf, 'bi_data', None)!r})")
        super().verify_and_update_config(vllm_config)


class DllmEngineConfig(BidirectionalPromptEngineConfig):
    MODEL_NAME = "LLaDA / Dream models"
    PROMPT_KIND = "a diffusion LLM's prompt"
    ATTENTION_KIND = "dllm"


def bidirectional_prompt_settings(vllm_config, model_name: str, prompt_kind: str) -> None:
    """Engine settings of a model whose prompt is attended bidirectionally (AS-ARMs, dLLMs):
    the prompt is prefilled in one step (chunked prefill off,
    ``max_num_batched_tokens >= max_model_len``) and its KV are never shared with another
    prompt (prefix caching off)."""
    cache, sched = vllm_config.cache_config, vllm_config.scheduler_config
    if str(getattr(cache, "cache_dtype", "auto")).startswith("fp8"):
        raise ValueError(
            f"{model_name}: an fp8 KV cache (kv_cache_dtype={cache.cache_dtype!r}) is not "
            f"supported: the plugin's attention paths read and copy raw cache entries without "
            f"fp8 scales; use kv_cache_dtype='auto'")
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


def plugin_attention_settings(vllm_config, model_name: str, kind: str,
                              on_cpu: bool | None = None) -> None:
    """The plugin's attention (``attention_backends/selection.py``): the choice is checked
    here, at start-up (a bad ``VLLM_ANYORDER_ATTENTION``, ``cpu_op`` off the CPU platform).
    Off the CPU platform the model runs eagerly: its row groups are Python lists that a CUDA
    graph cannot replay (vLLM honours ``enforce_eager`` set in this hook: it runs before the
    compilation settings are derived). On CPU there are no CUDA graphs; the setting is left
    as the user gave it."""
    from vllm_anyorder.attention_backends import selection

    if on_cpu is None:
        from vllm.platforms import current_platform

        on_cpu = bool(current_platform.is_cpu())
    impl = selection.implementation(kind, on_cpu)
    model_config = vllm_config.model_config
    if not on_cpu and not model_config.enforce_eager:
        logger.info("vllm_anyorder: %s: eager mode, no CUDA graphs (anyorder attention: %s)",
                    model_name, impl)
        model_config.enforce_eager = True
