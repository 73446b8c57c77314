"""Attention metadata for the plugin's own forwards over vLLM's paged cache, shared by the
AS-ARM and dLLM backends (neutral: neither backend's module).

The plugin runs forwards vLLM does not schedule (ASSD's drafting queries, dLLM node and
repair forwards); :func:`build_metadata` lays their rows out request by request and asks the
layer group's metadata builder (whatever backend it is) to build them, as vLLM's runner
would. :func:`layer_metadata` reads one layer's metadata from vLLM's forward context.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_anyorder import _compat


def layer_metadata(layer_name: str) -> Any:
    """The attention metadata of one layer in the current vLLM forward."""
    raw = _compat.forward_context().attn_metadata
    if isinstance(raw, dict):
        return raw.get(layer_name)
    if isinstance(raw, list):
        return raw[0].get(layer_name) if raw else None
    return raw


def build_metadata(builder: Any, query_lens: list[int], seq_lens: list[int],
                   block_table: torch.Tensor, slot_mapping: torch.Tensor,
                   causal: bool) -> Any:
    """Backend metadata for rows laid out request by request (``query_lens[i]`` rows of
    request i, whose sequence is ``seq_lens[i]`` long counting those rows when they are
    content rows, or the prefix they read when they are query rows)."""
    device = block_table.device
    qsl = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(query_lens, dtype=torch.int32), 0)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    cm = _compat.common_attention_metadata_cls()(
        query_start_loc=qsl.to(device),
        query_start_loc_cpu=qsl,
        seq_lens=seq.to(device),
        num_reqs=len(query_lens),
        num_actual_tokens=int(qsl[-1]),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_table_tensor=block_table,
        slot_mapping=slot_mapping,
        causal=causal,
    )
    return builder.build(0, cm)


def prefix_metadata(builder: Any, num_queries: list[int], prefix_lens: list[int],
                    block_table: torch.Tensor) -> Any:
    """Metadata for query rows that each see exactly the first ``prefix_lens[i]`` cached
    tokens of request i (causal off: every row attends to the whole prefix; the rows
    themselves are never in the cache; more rows than prefix tokens is fine)."""
    total = sum(num_queries)
    slots = torch.full((total,), -1, dtype=torch.int64, device=block_table.device)
    return build_metadata(builder, num_queries, prefix_lens, block_table, slots, causal=False)
