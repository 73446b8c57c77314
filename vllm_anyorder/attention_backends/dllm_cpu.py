"""Block-causal attention of diffusion LLMs (LLaDA, Dream) on vLLM's stock CPU op (CPU only).

The cache policy (the engine-free twin is ``core/dllm_cache.py``, policy ``prefix``): the
prompt attends to itself bidirectionally; a generated row in block b attends to the prompt and
to every row of blocks <= b (bidirectional inside its block, nothing after it). A committed
block's keys and values therefore never change and are written once into vLLM's paged cache
(:class:`dllm_plans.BlockCausalBuilderMixin`). The proposer's node forwards run on scratch
copies of the prefix blocks (:func:`dllm_plans.scratch_plan`): the op's per-ISA block
layout is never interpreted.
"""

from __future__ import annotations

import torch

from vllm_anyorder import _compat
from vllm_anyorder.attention_backends import dllm_plans

_cpu = _compat.cpu_attention_module()


class DllmCPUMetadataBuilder(dllm_plans.BlockCausalBuilderMixin,
                             _cpu.CPUAttentionMetadataBuilder):
    def node_plan(self, jobs: list[dllm_plans.NodeJob], caches: list[torch.Tensor],
                  block_size: int) -> dllm_plans.RowPlan:
        # module lookup at each call: benchmarks/breakdown.py times the copies by wrapping it
        return dllm_plans.scratch_plan(self, jobs, caches, block_size)


class DllmCPUBackend(_cpu.CPUAttentionBackend):
    @staticmethod
    def get_builder_cls():
        return DllmCPUMetadataBuilder
