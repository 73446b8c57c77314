"""vLLM model classes of the families the plugin serves (``families.FAMILIES``): AS-ARM
(``asarm_vllm``), XLNet as an AS-ARM (``xlnet_vllm``), LLaDA and Dream (``dllm_vllm``); their
Hugging Face config classes (``hf_configs``) and engine settings (``engine_configs``).
``register()`` installs them in vLLM. The plain-PyTorch models and checkpoint formats they
load live apart (reference models, drafters). Importing this package imports neither torch
nor vLLM."""

from __future__ import annotations

import importlib


def _attribute(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def register() -> None:
    """Make vLLM (and transformers' AutoConfig) load every family's checkpoints: the model
    class in ``ModelRegistry`` (lazily, by path), the config class in ``AutoConfig``, the
    engine settings in vLLM's ``MODELS_CONFIG_MAP``. Idempotent."""
    from vllm import ModelRegistry

    from vllm_anyorder import _compat
    from vllm_anyorder.families import FAMILIES
    from vllm_anyorder.model_executor import hf_configs

    hf_configs.register()
    hooks = _compat.models_config_map()
    supported = ModelRegistry.get_supported_archs()
    for family in FAMILIES:
        if family.architecture not in supported:
            ModelRegistry.register_model(family.architecture, family.model_class)
        hooks.setdefault(family.architecture, _attribute(family.engine_config))
