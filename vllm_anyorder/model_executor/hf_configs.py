"""Hugging Face config classes of the families the plugin serves (``families.FAMILIES``).

Module level: vLLM pickles the engine config (which holds the HF config object) into its
engine and worker processes, so each class must be importable by name. ``register()`` (from
``model_executor.register``) installs them in ``transformers.AutoConfig``, replacing any
earlier registration of the model type (idempotent).

* ``anyorder_llama``: a ``LlamaConfig`` (extra keys such as ``query_init`` kept as attributes).
* ``xlnet``: transformers' ``XLNetConfig`` reports ``max_position_embeddings = -1`` (XLNet's
  relative encodings have no length limit) and refuses to store the key, so vLLM cannot
  derive a maximum model length and rejects every ``max_model_len``. The subclass answers a
  real limit: ``max_position_embeddings`` from config.json when present, else 512 (XLNet's
  pre-training sequence length).
* LLaDA's ``config.json`` uses OLMo names (``d_model``, ``n_heads``, ``n_layers``,
  ``n_kv_heads``, ``max_sequence_length``); ``attribute_map`` exposes them under the names
  vLLM reads to size the KV cache (``hidden_size``, ``num_attention_heads``, ...).
* Dream's uses Qwen2 names, so its class is a ``Qwen2Config`` with ``model_type "Dream"``.
"""

from __future__ import annotations

from transformers import AutoConfig, LlamaConfig, PretrainedConfig, Qwen2Config, XLNetConfig

from vllm_anyorder.families import FAMILIES

XLNET_DEFAULT_MAX_POSITIONS = 512


class AnyOrderLlamaConfig(LlamaConfig):
    model_type = "anyorder_llama"


class XLNetAsArmConfig(XLNetConfig):
    @property
    def max_position_embeddings(self) -> int:
        return int(self.__dict__.get("_anyorder_max_positions") or XLNET_DEFAULT_MAX_POSITIONS)

    @max_position_embeddings.setter
    def max_position_embeddings(self, value) -> None:
        self.__dict__["_anyorder_max_positions"] = value


class LLaDAHFConfig(PretrainedConfig):
    model_type = "llada"
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "n_heads",
        "num_hidden_layers": "n_layers",
        "num_key_value_heads": "n_kv_heads",
        "max_position_embeddings": "max_sequence_length",
    }


class DreamHFConfig(Qwen2Config):
    model_type = "Dream"


HF_CONFIGS = {cls.model_type: cls for cls in
              (AnyOrderLlamaConfig, XLNetAsArmConfig, LLaDAHFConfig, DreamHFConfig)}
assert set(HF_CONFIGS) == {f.model_type for f in FAMILIES}, "one HF config class per family"


def register() -> None:
    """Idempotent: ``AutoConfig`` reads every family's model type with its class here."""
    for model_type, cls in HF_CONFIGS.items():
        AutoConfig.register(model_type, cls, exist_ok=True)
