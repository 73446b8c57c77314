"""Device-agnostic paged attention in plain PyTorch, for every mask the plugin uses.

vLLM's GPU backends cannot express the plugin's masks over the paged cache (issue 14: no
per-request causal flags with relative scores, no request ids in mask hooks), and its CPU
op runs on CPU only. What works on every device is this: write K/V into the paged cache by
slot, gather a row group's keys by its block-table row, and attend with an explicit mask
(``torch.nn.functional.scaled_dot_product_attention``, any device, fp32 / bf16 / fp16).

Cache layout: vLLM 0.32's logical per-layer view ``kv_cache [num_blocks, kv_heads,
block_size, 2 * head_dim]`` (key | value in the last axis; vLLM allocates it, in whatever
physical stride order it resolves: indexing here is logical). Only this implementation
writes and reads it. Token slot s lives at block ``s // block_size``, offset
``s % block_size``; slot -1 marks a padding row (never written).

A forward's rows come in **row groups** (:class:`RowGroup`): consecutive rows of one request
that read the first ``seq_len`` cached tokens of one block-table row, with one mask rule:

* ``causal``: row r of R sees keys ``[0, seq_len - R + r]`` (decoding, verification);
* ``bidirectional``: every row sees all ``seq_len`` keys (a prompt; query rows that read a
  prefix without writing; dLLM node rows over a committed prefix ... see ``prefix``);
* ``prompt_len`` > 0 with ``causal``: keys of the first ``prompt_len`` positions are seen by
  every row, rows inside the prompt see the whole prompt (AS-ARM: bidirectional prompt,
  causal after it);
* ``block_ends``: block-causal (dLLM semi-AR blocks): the row at position p sees keys below
  the end of p's block (block ends are positions; the last end is seq_len);
* ``score_bias``: an additive ``[heads, R, S]`` term (XLNet's relative-position scores);
* ``cached`` < S: only keys ``[0, cached)`` come from the cache, keys ``[cached, S)`` are the
  group's own rows' k/v of this forward, not written (dLLM node canvases: several candidate
  blocks over one committed prefix, without scratch copies of the prefix).

Shapes: q ``[T, heads, D]``; k/v rows ``[T, kv_heads, D]``; GQA: heads = kv_heads x g.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F


def cache_shape(num_blocks: int, block_size: int, kv_heads: int, head_dim: int):
    return (num_blocks, kv_heads, block_size, 2 * head_dim)


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor) -> None:
    """Store k, v [T, kv_heads, D] at ``slots`` [T] (-1 rows skipped; extra slots ignored)."""
    if kv_cache is None or kv_cache.numel() == 0:
        return
    block_size, head_dim = kv_cache.shape[2], k.shape[-1]
    slots = slots[: k.shape[0]].to(torch.int64)
    keep = slots >= 0
    slots = slots[keep]
    blocks, offsets = slots // block_size, slots % block_size
    kv_cache[blocks, :, offsets, :head_dim] = k[: keep.shape[0]][keep].to(kv_cache.dtype)
    kv_cache[blocks, :, offsets, head_dim:] = v[: keep.shape[0]][keep].to(kv_cache.dtype)


def gather_kv(kv_cache: torch.Tensor, block_row: torch.Tensor, seq_len: int):
    """Keys and values [seq_len, kv_heads, D] of the first ``seq_len`` tokens of a request
    whose block-table row is ``block_row`` [max_blocks]."""
    block_size, head_dim = kv_cache.shape[2], kv_cache.shape[3] // 2
    j = torch.arange(seq_len, device=block_row.device)
    blocks = block_row[j // block_size].to(torch.int64)
    kv = kv_cache[blocks, :, j % block_size]  # [S, kv_heads, 2D]
    return kv[..., :head_dim], kv[..., head_dim:]


@dataclass(frozen=True)
class RowGroup:
    block_row: int  # row of the block table
    first: int  # first row of the group in the forward's rows
    rows: int  # R
    seq_len: int  # S: cached tokens the group reads (its own rows included if written)
    causal: bool = True
    prompt_len: int = 0  # with causal: keys/rows below it are bidirectional (AS-ARM)
    block_ends: tuple[int, ...] = ()  # block-causal (dLLM): ascending ends, last == S
    positions: torch.Tensor | None = None  # [R] row positions (default S - R .. S - 1)
    cached: int | None = None  # keys read from the cache (default S); the rest: own rows


def group_mask(group: RowGroup, device=None) -> torch.Tensor:
    """bool [R, S]: True where row r may attend to key j."""
    rows, seq = group.rows, group.seq_len
    keys = torch.arange(seq, device=device)
    pos = group.positions.to(device) if group.positions is not None else \
        torch.arange(seq - rows, seq, device=device)
    if group.block_ends:
        ends = torch.tensor(group.block_ends, device=device)
        limit = ends[torch.searchsorted(ends, pos, right=True).clamp(max=len(ends) - 1)]
        return keys[None, :] < limit[:, None]
    if not group.causal:
        return torch.ones(rows, seq, dtype=torch.bool, device=device)
    limit = torch.maximum(pos, torch.full_like(pos, group.prompt_len - 1))
    return keys[None, :] <= limit[:, None]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
           scale: float, score_bias: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of q [R, H, D] over k, v [S, Hkv, D] with mask [R, S] (True = visible) and
    an optional additive bias [H, R, S] -> [R, H, D]; a row that sees no key gets zeros.
    Scores in fp32 for fp16 / bf16 inputs (the softmax of a long row in half precision
    loses the ordering the equality tests check)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads != kv_heads:  # GQA: each kv head serves heads // kv_heads query heads
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    dtype = q.dtype
    qf, kf, vf = (t.transpose(0, 1).float() for t in (q, k, v))  # [H, R|S, D]
    bias = torch.zeros(mask.shape, dtype=torch.float32, device=q.device)
    bias = bias.masked_fill(~mask, float("-inf"))[None]
    if score_bias is not None:
        bias = bias + score_bias.float()
    seen = mask.any(dim=1)  # [R]
    bias = bias.masked_fill(~seen[None, :, None], 0.0)  # no NaN rows; zeroed below
    out = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=bias, scale=scale)
    out = out.transpose(0, 1).masked_fill(~seen[:, None, None], 0.0)
    return out.to(dtype)


def paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                    groups: list[RowGroup], scale: float,
                    score_bias: Callable[[RowGroup, torch.Tensor], torch.Tensor] | None = None,
                    k_rows: torch.Tensor | None = None, v_rows: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """Rows of ``q`` [T, H, D] grouped by ``groups`` over the paged cache -> [T, H, D]
    (rows in no group are zeros). ``score_bias(group, key_slots [S])`` -> [H, R, S] (slot
    -1 for keys that are own rows). ``k_rows``/``v_rows`` [T, Hkv, D]: this forward's k/v,
    read by groups with ``cached`` < S."""
    out = torch.zeros_like(q)
    for g in groups:
        if g.rows <= 0 or g.seq_len <= 0:
            continue
        row = block_table[g.block_row]
        rows = slice(g.first, g.first + g.rows)
        cached = g.seq_len if g.cached is None else g.cached
        k, v = gather_kv(kv_cache, row, cached)
        if cached < g.seq_len:  # the rest of the keys: the group's own rows, in order
            assert g.seq_len - cached == g.rows, "own keys must be exactly the group's rows"
            k = torch.cat([k, k_rows[rows].to(k.dtype)])
            v = torch.cat([v, v_rows[rows].to(v.dtype)])
        bias = None
        if score_bias is not None:
            bs = kv_cache.shape[2]
            j = torch.arange(g.seq_len, device=row.device)
            slots = row[(j // bs).clamp(max=row.shape[0] - 1)].to(torch.int64) * bs + j % bs
            bias = score_bias(g, torch.where(j < cached, slots, -1))
        out[rows] = attend(q[rows], k, v, group_mask(g, q.device), scale, bias)
    return out
