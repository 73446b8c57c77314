"""The Hugging Face config class of ``anyorder_llama`` checkpoints, at module level.

vLLM pickles the engine config (which holds the HF config object) into its engine and
worker processes, so the config class must be importable by name; ``register()`` installs
it in ``transformers.AutoConfig`` (replacing any earlier registration of the model type).
"""

from __future__ import annotations

from transformers import AutoConfig, LlamaConfig

from vllm_anyorder.model_executor.asarm import MODEL_TYPE


class AnyOrderLlamaConfig(LlamaConfig):
    """A LlamaConfig whose ``model_type`` is ``anyorder_llama`` (extra keys such as
    ``query_init`` are kept as attributes)."""

    model_type = MODEL_TYPE


def register() -> None:
    """Idempotent: ``AutoConfig`` reads ``anyorder_llama`` with this class."""
    AutoConfig.register(MODEL_TYPE, AnyOrderLlamaConfig, exist_ok=True)
