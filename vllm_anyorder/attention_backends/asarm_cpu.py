"""AS-ARM attention on vLLM's stock CPU op (``cpu_attention_with_kv_cache``, CPU only).

The masks are :class:`asarm_attention.AsArmBuilderMixin`'s; vLLM's CPU builder turns its
per-request causal flags into the op's ``dynamic_causal``, and query rows that read without
writing are the op called without the cache update (``asarm_attention.query_attention``).
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_anyorder import _compat
from vllm_anyorder.attention_backends.asarm_attention import AsArmBuilderMixin, AsArmFields

_cpu = _compat.cpu_attention_module()


@dataclass
class AsArmCPUMetadata(AsArmFields, _cpu.CPUAttentionMetadata):
    """vLLM's CPU metadata of the content rows plus the AS-ARM fields."""


class AsArmCPUMetadataBuilder(AsArmBuilderMixin, _cpu.CPUAttentionMetadataBuilder):
    METADATA = AsArmCPUMetadata


class AsArmCPUBackend(_cpu.CPUAttentionBackend):
    """vLLM's CPU attention with :class:`AsArmCPUMetadataBuilder` (per-layer backend of the
    AS-ARM model; the platform's own selection is not touched)."""

    @staticmethod
    def get_builder_cls():
        return AsArmCPUMetadataBuilder
