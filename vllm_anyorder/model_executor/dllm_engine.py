"""Registration and engine settings of the diffusion-LLM model classes (LLaDA, Dream).

``register()`` (from the plugin's ``register()`` in every vLLM process) teaches transformers'
``AutoConfig`` the two model types, maps the architectures lazily to ``dllm_vllm`` and adds
:class:`DllmEngineConfig` to vLLM's per-architecture hook table. Importing this module imports
neither torch nor vLLM.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("vllm_anyorder")

MODEL_CLASSES = {
    "LLaDAModelLM": "vllm_anyorder.model_executor.dllm_vllm:LLaDAForDiffusionLM",
    "DreamModel": "vllm_anyorder.model_executor.dllm_vllm:DreamForDiffusionLM",
}


class DllmEngineConfig:
    """Engine settings a served dLLM needs (vLLM's ``MODELS_CONFIG_MAP`` hook protocol): the
    prompt is attended bidirectionally, so it is prefilled in one step (no chunked prefill)
    and its KV are not shared with other prompts (no prefix caching)."""

    @staticmethod
    def verify_and_update_model_config(model_config) -> None:
        return

    @staticmethod
    def verify_and_update_config(vllm_config) -> None:
        from vllm_anyorder.model_executor.asarm_engine import bidirectional_prompt_settings

        bidirectional_prompt_settings(vllm_config, "LLaDA / Dream models",
                                      "a diffusion LLM's prompt")

def register() -> None:
    from vllm import ModelRegistry

    from vllm_anyorder import _compat
    from vllm_anyorder.model_executor import dllm_hf_config

    dllm_hf_config.register()
    hooks = _compat.models_config_map()
    for arch, path in MODEL_CLASSES.items():
        if arch not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(arch, path)
        hooks.setdefault(arch, DllmEngineConfig)


def dllm_shape_of(hf_config):
    """(mask id, eos id, logit shift) of a served dLLM config, or None if it is not one."""
    archs = set(getattr(hf_config, "architectures", None) or [])
    if "LLaDAModelLM" in archs:
        return int(hf_config.mask_token_id), getattr(hf_config, "eos_token_id", None), 0
    if "DreamModel" in archs:
        return int(hf_config.mask_token_id), getattr(hf_config, "eos_token_id", None), 1
    return None
