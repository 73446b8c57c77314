"""The Hugging Face config class vLLM reads XLNet AS-ARM checkpoints with.

transformers' ``XLNetConfig`` reports ``max_position_embeddings = -1`` (XLNet's relative
encodings have no length limit) and refuses to store the key, so vLLM cannot derive a
maximum model length and rejects every ``max_model_len``. This subclass answers a real
limit: ``max_position_embeddings`` from config.json when present, else 512 (XLNet's
pre-training sequence length). ``register()`` installs it for ``model_type == "xlnet"``
(module level: vLLM pickles the config into its engine and worker processes).
"""

from __future__ import annotations

from transformers import AutoConfig, XLNetConfig

DEFAULT_MAX_POSITIONS = 512


class XLNetAsArmConfig(XLNetConfig):
    @property
    def max_position_embeddings(self) -> int:
        return int(self.__dict__.get("_anyorder_max_positions") or DEFAULT_MAX_POSITIONS)

    @max_position_embeddings.setter
    def max_position_embeddings(self, value) -> None:
        self.__dict__["_anyorder_max_positions"] = value


def register() -> None:
    """Idempotent: ``AutoConfig`` reads ``xlnet`` checkpoints with this class."""
    AutoConfig.register(XLNetConfig.model_type, XLNetAsArmConfig, exist_ok=True)
