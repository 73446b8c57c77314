"""Block-causal attention of diffusion LLMs in plain PyTorch over the paged cache (any device).

vLLM's own forward: :class:`dllm_plans.BlockCausalBuilderMixin` over :mod:`torch_backend`.
Node forwards (:func:`node_plan`) need no scratch copies: each node is one
:class:`paged_torch.RowGroup` that reads its request's committed prefix ``[0, start)`` from
the paged cache and its own rows ``[start, end)`` from the forward (``cached`` = start),
block-causally (``block_ends`` = the plan's cuts), and writes nothing.
"""

from __future__ import annotations

import torch

from vllm_anyorder.attention_backends import dllm_plans
from vllm_anyorder.attention_backends.paged_torch import RowGroup
from vllm_anyorder.attention_backends.torch_backend import (
    TorchPagedBackend,
    TorchPagedMetadata,
    TorchPagedMetadataBuilder,
)


def node_plan(jobs: list[dllm_plans.NodeJob], device: torch.device) -> dllm_plans.RowPlan:
    """Rows laid out job by job, node by node (the order of ``DllmRowRunner.evaluate``)."""
    width = max(int(j.blocks.numel()) for j in jobs)
    table = torch.zeros(len(jobs), width, dtype=torch.int32)
    groups, first = [], 0
    for i, job in enumerate(jobs):
        table[i, : job.blocks.numel()] = job.blocks.to(torch.int32)
        rows = job.end - job.start
        positions = torch.arange(job.start, job.end, device=device)
        for _ in range(job.nodes):
            groups.append(RowGroup(i, first, rows, job.end, causal=False,
                                   block_ends=job.cuts, positions=positions, cached=job.start))
            first += rows
    slots = torch.full((first,), -1, dtype=torch.int64, device=device)
    return dllm_plans.RowPlan(TorchPagedMetadata(first, groups, table.to(device), slots),
                              slots, None)


class DllmTorchMetadataBuilder(dllm_plans.BlockCausalBuilderMixin, TorchPagedMetadataBuilder):
    def node_plan(self, jobs: list[dllm_plans.NodeJob], caches: list[torch.Tensor],
                  block_size: int) -> dllm_plans.RowPlan:
        return node_plan(jobs, caches[0].device)


class DllmTorchBackend(TorchPagedBackend):
    @staticmethod
    def get_builder_cls():
        return DllmTorchMetadataBuilder
