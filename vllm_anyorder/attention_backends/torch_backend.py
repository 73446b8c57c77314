"""The plugin's device-agnostic attention backend: :mod:`paged_torch` behind vLLM's backend API.

vLLM allocates the paged cache (logical view ``[num_blocks, kv_heads, block_size, 2 * D]``)
and calls, per layer and forward, ``do_kv_cache_update`` (write the rows' K/V at their
slots) and ``forward`` (attend). This backend does both in plain PyTorch
(:func:`paged_torch.write_kv`, :func:`paged_torch.paged_attention`), so it runs wherever
PyTorch does (CPU, CUDA). Its metadata is a list of :class:`paged_torch.RowGroup` built from
vLLM's ``CommonAttentionMetadata`` by :class:`TorchPagedMetadataBuilder`, a subclass of vLLM's
generic builder (no CPU scheduler op). The AS-ARM and dLLM builders
(``asarm_torch.py``, ``dllm_torch.py``) add their masks on top, as their CPU twins do over
vLLM's CPU builder.

Refused at construction (engine start-up): ALiBi, sliding windows, logit soft-capping, an
fp8 KV cache, attention types other than decoder self-attention. CUDA graphs: never (the
row groups are Python lists; the plugin's engine settings force eager mode).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vllm_anyorder import _compat
from vllm_anyorder.attention_backends.paged_torch import (
    PreparedGroups,
    RowGroup,
    paged_attention,
    prepared_for,
    write_kv,
)

_backend = _compat.attention_backend_module()
NAME = "ANYORDER_TORCH"


@dataclass
class TorchPagedMetadata:
    """Row groups of one forward (``groups``), the block table they index and the slots
    ``slot_mapping`` [T] where the forward's rows are written (-1: not written);
    ``prepared``: the groups as padded batch tensors, built by the first layer."""

    num_actual_tokens: int
    groups: list[RowGroup]
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    prepared: list[PreparedGroups] | None = None


def row_groups(cm: Any) -> list[RowGroup]:
    """One group per request of ``cm`` (CommonAttentionMetadata): its rows, its block-table
    row, ``seq_len`` keys, and its causal flag (``cm.causal``: a bool or one flag per request;
    causal row r of R sees keys [0, seq_len - R + r], non-causal rows all ``seq_len``)."""
    num_reqs = cm.num_reqs
    qsl = cm.query_start_loc_cpu[: num_reqs + 1].to(torch.int64).tolist()
    seq_lens = cm.seq_lens[:num_reqs].cpu().to(torch.int64).tolist()
    flags = cm.causal.cpu().tolist() if isinstance(cm.causal, torch.Tensor) \
        else [bool(cm.causal)] * num_reqs
    return [RowGroup(i, qsl[i], qsl[i + 1] - qsl[i], seq_lens[i], causal=bool(flags[i]))
            for i in range(num_reqs)]


class TorchPagedMetadataBuilder(_backend.AttentionMetadataBuilder):
    """vLLM's generic builder contract -> :class:`TorchPagedMetadata` (no device op)."""

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size

    def build(self, common_prefix_len: int, common_attn_metadata: Any,
              fast_build: bool = False) -> TorchPagedMetadata:
        cm = common_attn_metadata
        return TorchPagedMetadata(int(cm.num_actual_tokens), row_groups(cm),
                                  cm.block_table_tensor, cm.slot_mapping)


class TorchPagedImpl(_backend.AttentionImpl):
    """Writes and attends in PyTorch (see the module doc)."""

    def __init__(self, num_heads: int, head_size: int, scale: float,
                 num_kv_heads: int | None = None, alibi_slopes=None, sliding_window=None,
                 kv_cache_dtype: str = "auto", logits_soft_cap=None,
                 attn_type: str = "decoder", kv_sharing_target_layer_name=None,
                 **unused: Any) -> None:
        refused = {"ALiBi": alibi_slopes is not None, "a sliding window": sliding_window,
                   "logit soft-capping": logits_soft_cap,
                   f"kv_cache_dtype={kv_cache_dtype!r}": str(kv_cache_dtype).startswith("fp8"),
                   f"attention type {attn_type!r}": attn_type != "decoder"}
        bad = [name for name, on in refused.items() if on]
        if bad:
            raise NotImplementedError(f"anyorder torch attention does not support {', '.join(bad)}")
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.attn_type = attn_type

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("fused output quantization")
        if attn_metadata is None:  # profiling / warm-up run
            return output
        n = attn_metadata.num_actual_tokens
        output[:n] = paged_attention(
            query[:n], kv_cache, attn_metadata.block_table, attn_metadata.groups, self.scale,
            k_rows=key, v_rows=value, prepared=prepared_for(attn_metadata, kv_cache))
        return output

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        write_kv(kv_cache, key, value, slot_mapping)


class TorchPagedBackend(_backend.AttentionBackend):
    forward_includes_kv_cache_update = False
    supported_dtypes = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes = ["auto", "float16", "bfloat16"]

    @staticmethod
    def get_name() -> str:
        return NAME

    @staticmethod
    def get_impl_cls():
        return TorchPagedImpl

    @staticmethod
    def get_builder_cls():
        return TorchPagedMetadataBuilder

    @classmethod
    def supports_non_causal(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == "decoder"


def register() -> None:
    """Make :data:`NAME` a vLLM backend name (vLLM's ``Attention`` looks its backend's name
    up in ``AttentionBackendEnum``); idempotent, needed in every process that builds a
    model (the plugin models call it)."""
    registry = _compat.attention_registry_module()
    if NAME not in registry.AttentionBackendEnum.__members__:
        registry.register_backend(NAME, f"{__name__}.TorchPagedBackend")
