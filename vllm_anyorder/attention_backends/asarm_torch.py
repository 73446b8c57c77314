"""AS-ARM attention in plain PyTorch over the paged cache (any device): the masks of
:class:`asarm_attention.AsArmBuilderMixin` over :mod:`torch_backend`'s row groups. Also the
XLNet AS-ARM's backend (its relative-position scores are computed in PyTorch either way,
``xlnet_relative.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_anyorder.attention_backends.asarm_attention import AsArmBuilderMixin, AsArmFields
from vllm_anyorder.attention_backends.torch_backend import (
    TorchPagedBackend,
    TorchPagedMetadata,
    TorchPagedMetadataBuilder,
)


@dataclass
class AsArmTorchMetadata(AsArmFields, TorchPagedMetadata):
    """Row groups of the content rows plus the AS-ARM fields."""


class AsArmTorchMetadataBuilder(AsArmBuilderMixin, TorchPagedMetadataBuilder):
    METADATA = AsArmTorchMetadata


class AsArmTorchBackend(TorchPagedBackend):
    @staticmethod
    def get_builder_cls():
        return AsArmTorchMetadataBuilder
