"""Hugging Face config classes of the diffusion LLMs vLLM serves through the plugin.

Module level (vLLM pickles the engine config, HF config object included, into its engine and
worker processes). ``register()`` installs them in ``transformers.AutoConfig``.

* LLaDA's ``config.json`` uses OLMo names (``d_model``, ``n_heads``, ``n_layers``,
  ``n_kv_heads``, ``max_sequence_length``); ``attribute_map`` exposes them under the names vLLM
  reads to size the KV cache (``hidden_size``, ``num_attention_heads``, ...).
* Dream's uses Qwen2 names, so its class is a ``Qwen2Config`` with ``model_type "Dream"``.
"""

from __future__ import annotations

from transformers import AutoConfig, PretrainedConfig, Qwen2Config

from vllm_anyorder.model_executor.dream import MODEL_TYPE as DREAM_TYPE
from vllm_anyorder.model_executor.llada import MODEL_TYPE as LLADA_TYPE


class LLaDAHFConfig(PretrainedConfig):
    model_type = LLADA_TYPE
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "n_heads",
        "num_hidden_layers": "n_layers",
        "num_key_value_heads": "n_kv_heads",
        "max_position_embeddings": "max_sequence_length",
    }


class DreamHFConfig(Qwen2Config):
    model_type = DREAM_TYPE


def register() -> None:
    """Idempotent."""
    AutoConfig.register(LLADA_TYPE, LLaDAHFConfig, exist_ok=True)
    AutoConfig.register(DREAM_TYPE, DreamHFConfig, exist_ok=True)
