"""Row plans of the dLLM proposer's own forwards over vLLM's paged cache (shared by both
attention implementations) and the one function that runs a layer on them.

Two kinds of hook forwards (``dllm_rows.DllmRowRunner``):

* **Denoising / verification forwards** (one per step, every node of every request): each
  evaluated canvas ("node") of a request attends to the request's committed prefix plus its
  own rows, block-causally (a row of block b sees keys up to the end of block b), and
  writes nothing to the real cache. With vLLM's CPU op the node gets private copies of the
  cache blocks its window needs (:func:`scratch_plan`: prefix blocks copied whole, the op's
  per-ISA block layout never interpreted; the node's rows written behind them with the op's
  own cache write); the PyTorch implementation reads the prefix from the paged cache and the
  node's rows from the forward itself (``dllm_torch.node_plan``: no copies).
* **Repair forwards** (:func:`repair_plan`): rows whose K/V vLLM wrote incompletely (after a
  preemption recompute) are rewritten in place in the real cache.

Groups follow the block-causal rule with the implementation's bidirectional groups: rows
of a group see every key before the group's end.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from vllm_anyorder.attention_backends.metadata import build_metadata


class BlockCausalBuilderMixin:
    """vLLM's own forward of a dLLM: ``causal=False`` for every request (listed before an
    implementation's builder). The ``dllm`` proposer schedules exactly one whole unit per
    step (the prompt at prefill, then the block decided in the previous step: its first
    token as vLLM's "bonus" token, the rest as drafts), so every row attending to all
    ``seq_len`` keys (the cached prefix + that unit) is exactly the block-causal rule, and
    the unit's K/V land in the request's own slots: the committed prefix cache
    (``docs/CONTRACTS.md``). Subclasses add ``node_plan(jobs, caches, block_size)``."""

    def build(self, common_prefix_len: int, common_attn_metadata: Any, fast_build: bool = False):
        cm = common_attn_metadata
        if cm.causal is True:
            cm = replace(cm, causal=False)
        return super().build(common_prefix_len, cm, fast_build)


@dataclass(frozen=True)
class RowPlan:
    """Attention inputs of a hook forward: ``metadata`` (one op "sequence" per row group),
    ``slots`` [R] where each row's K/V are written, ``caches`` per-layer scratch caches
    (None: the real paged caches)."""

    metadata: Any
    slots: torch.Tensor
    caches: list[torch.Tensor] | None


@dataclass(frozen=True)
class NodeJob:
    """Rows of one request in a hook forward: ``nodes`` canvases, each with rows for the
    absolute positions [start, end); ``cuts`` = ascending group ends (block ends, last =
    ``end``); ``blocks`` = the request's block-table row (physical block ids)."""

    blocks: torch.Tensor
    start: int
    end: int
    nodes: int
    cuts: tuple[int, ...]


def _groups(start: int, cuts: tuple[int, ...]):
    """(query rows, seq_len) per group: rows of a group see every key before its end."""
    out, lo = [], start
    for hi in cuts:
        if hi > lo:
            out.append((hi - lo, hi))
            lo = hi
    return out


def scratch_plan(builder: Any, jobs: list[NodeJob], caches: list[torch.Tensor],
                 block_size: int) -> RowPlan:
    """Private scratch blocks per node: copies of the request's prefix blocks (shared by its
    nodes) and of the partial block the window starts in, plus room for the window."""
    bs = block_size
    src: list[int] = []  # scratch block i is a copy of real block src[i] (-1: nothing)
    tables, slots, qlens, seqlens, table_rows = [], [], [], [], []
    for job in jobs:
        nfull, part = divmod(job.start, bs)
        shared = list(range(len(src), len(src) + nfull))
        src += job.blocks[:nfull].tolist()
        ntail = -(-(part + job.end - job.start) // bs)
        for _ in range(job.nodes):
            tail = list(range(len(src), len(src) + ntail))
            src += [int(job.blocks[nfull]) if part else -1] + [-1] * (ntail - 1)
            table = shared + tail
            pos = torch.arange(job.start, job.end)
            slots.append(torch.tensor(table)[pos // bs] * bs + pos % bs)
            tables.append(table)
            for q, s in _groups(job.start, job.cuts):
                qlens.append(q)
                seqlens.append(s)
                table_rows.append(len(tables) - 1)
    copy = torch.tensor([i for i, b in enumerate(src) if b >= 0], dtype=torch.long)
    real = torch.tensor([b for b in src if b >= 0], dtype=torch.long)
    scratch = []
    for cache in caches:
        # zeros, not empty: the op reads whole blocks and NaN garbage past seq_len leaks
        s = cache.new_zeros((len(src),) + tuple(cache.shape[1:]))
        if copy.numel():
            s[copy] = cache[real.to(cache.device)]
        scratch.append(s)
    width = max(len(t) for t in tables)
    table = torch.zeros(len(tables), width, dtype=torch.int32)
    for i, t in enumerate(tables):
        table[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
    device = caches[0].device
    slot_t = torch.cat(slots).to(device)
    md = build_metadata(builder, qlens, seqlens, table[table_rows].to(device), slot_t,
                        causal=False)
    return RowPlan(md, slot_t, scratch)


def repair_plan(builder: Any, jobs: list[NodeJob], block_size: int) -> RowPlan:
    """Rows rewritten in place in the real cache (one node per job)."""
    bs = block_size
    slots, qlens, seqlens, rows = [], [], [], []
    width = max(int(j.blocks.numel()) for j in jobs)
    table = torch.zeros(len(jobs), width, dtype=torch.int32)
    for i, job in enumerate(jobs):
        table[i, : job.blocks.numel()] = job.blocks.to(torch.int32)
        pos = torch.arange(job.start, job.end)
        slots.append(job.blocks[pos // bs].to(torch.int64) * bs + pos % bs)
        for q, s in _groups(job.start, job.cuts):
            qlens.append(q)
            seqlens.append(s)
            rows.append(i)
    slot_t = torch.cat(slots)
    md = build_metadata(builder, qlens, seqlens, table[rows], slot_t, causal=False)
    return RowPlan(md, slot_t, None)


def node_attention(attn: Any, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   plan: RowPlan) -> torch.Tensor:
    """Write the rows' K/V where ``plan`` says, then attend with its metadata (the op vLLM's
    own ``Attention.forward`` runs). q [R, H*D] (rotary applied); returns [R, H*D]."""
    cache = plan.caches[layer] if plan.caches is not None else attn.kv_cache
    k = k.reshape(-1, attn.num_kv_heads, attn.head_size)
    v = v.reshape(-1, attn.num_kv_heads, attn.head_size_v)
    attn.impl.do_kv_cache_update(attn, k, v, cache, plan.slots)
    out = torch.empty(q.shape[0], attn.num_heads * attn.head_size_v, dtype=q.dtype,
                      device=q.device)
    attn.impl.forward(attn, q.reshape(-1, attn.num_heads, attn.head_size), k, v, cache,
                      plan.metadata, output=out.view(-1, attn.num_heads, attn.head_size_v))
    return out
