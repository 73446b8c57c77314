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
    slots = slots[: k.shape[0]].to(device=kv_cache.device, dtype=torch.int64)
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


@dataclass
class PreparedGroups:
    """A forward's row groups as padded batch tensors (built once per metadata and reused by
    every layer: they depend on the metadata only). G groups, R = max rows, S = max keys."""

    groups: list[RowGroup]
    rows: torch.Tensor  # [G, R] row of q (padding: 0)
    row_ok: torch.Tensor  # [G, R] a real row
    slots: torch.Tensor  # [G, S] cache slot of key j (0 where none: own row or padding)
    own: torch.Tensor | None  # [G, S] row of this forward's k/v for own keys (None: none)
    is_own: torch.Tensor | None  # [G, S]
    bias: torch.Tensor  # [G, 1, R, S] float32: 0 visible, -inf hidden (all 0 on rows that
    seen: torch.Tensor  # [G, R]            see no key: their output is zeroed)


# padded G x R x S elements per batch of groups (bounds the scores' memory: x heads x 4 B)
BATCH_BUDGET = 1 << 22


def prepare(groups: list[RowGroup], block_table: torch.Tensor, block_size: int,
            device: torch.device | None = None) -> list[PreparedGroups]:
    """Pad the non-empty groups into batches (in order, each within :data:`BATCH_BUDGET`),
    on ``device`` (the cache's; metadata built on the host is moved once here)."""
    if device is not None:
        block_table = block_table.to(device)
    batches: list[list[RowGroup]] = []
    current: list[RowGroup] = []
    for g in (g for g in groups if g.rows > 0 and g.seq_len > 0):
        trial = current + [g]
        size = len(trial) * max(x.rows for x in trial) * max(x.seq_len for x in trial)
        if current and size > BATCH_BUDGET:
            batches.append(current)
            trial = [g]
        current = trial
    if current:
        batches.append(current)
    return [_prepare(b, block_table, block_size) for b in batches]


def _prepare(groups: list[RowGroup], block_table: torch.Tensor, bs: int) -> PreparedGroups:
    device = block_table.device
    n, r_max, s_max = len(groups), max(g.rows for g in groups), max(g.seq_len for g in groups)
    r, j = torch.arange(r_max, device=device), torch.arange(s_max, device=device)
    first = torch.tensor([g.first for g in groups], device=device)
    nrows = torch.tensor([g.rows for g in groups], device=device)
    seq = torch.tensor([g.seq_len for g in groups], device=device)
    cached = torch.tensor([g.seq_len if g.cached is None else g.cached for g in groups],
                          device=device)
    row_ok = r[None] < nrows[:, None]
    table = block_table[torch.tensor([g.block_row for g in groups], device=device)]
    blocks = table[:, (j // bs).clamp(max=table.shape[1] - 1)].to(torch.int64)  # [G, S]
    from_cache = j[None] < cached[:, None]
    slots = torch.where(from_cache, blocks * bs + j % bs, 0)
    is_own = (~from_cache) & (j[None] < seq[:, None])
    own = torch.where(is_own, first[:, None] + j[None] - cached[:, None], 0) \
        if bool(is_own.any()) else None
    visible = torch.zeros(n, r_max, s_max, dtype=torch.bool, device=device)
    for i, g in enumerate(groups):
        visible[i, : g.rows, : g.seq_len] = group_mask(g, device)
    seen = visible.any(-1)
    bias = torch.zeros(visible.shape, dtype=torch.float32, device=device)
    bias = bias.masked_fill(~visible & seen[..., None], float("-inf"))[:, None]
    rows = torch.where(row_ok, first[:, None] + r[None], 0)
    return PreparedGroups(groups, rows, row_ok, slots, own, None if own is None else is_own,
                          bias, seen)


def prepared_for(metadata, kv_cache: torch.Tensor) -> list[PreparedGroups]:
    """:func:`prepare` of ``metadata.groups`` for ``kv_cache``, kept on ``metadata.prepared``
    so that every layer of a forward reuses it."""
    prepared = getattr(metadata, "prepared", None)
    if prepared is None:
        prepared = prepare(metadata.groups, metadata.block_table, kv_cache.shape[2],
                           kv_cache.device)
        metadata.prepared = prepared
    return prepared


def paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                    groups: list[RowGroup], scale: float,
                    score_bias: Callable[[RowGroup, torch.Tensor], torch.Tensor] | None = None,
                    k_rows: torch.Tensor | None = None, v_rows: torch.Tensor | None = None,
                    prepared: list[PreparedGroups] | None = None) -> torch.Tensor:
    """Rows of ``q`` [T, H, D] grouped by ``groups`` over the paged cache -> [T, H, D]
    (rows in no group are zeros): per batch of groups ONE gather of the keys by the block
    table and ONE masked SDPA, scores in fp32 (a half-precision softmax over a long row loses
    the ordering the equality tests check). ``score_bias(group, key_slots [S])`` ->
    [H, R, S], an additive score (slot -1 for keys that are own rows). ``k_rows``/``v_rows``
    [T, Hkv, D]: this forward's k/v, read by groups with ``cached`` < S (own keys: the
    group's rows in order). ``prepared``: :func:`prepare` of these groups (reused across
    layers); built here when None."""
    out = torch.zeros_like(q)
    if prepared is None:
        prepared = prepare(groups, block_table, kv_cache.shape[2], kv_cache.device)
    heads, head_dim, bs = q.shape[1], q.shape[2], kv_cache.shape[2]
    for p in prepared:
        kv = kv_cache[p.slots // bs, :, p.slots % bs].float()  # [G, S, Hkv, 2D]
        k, v = kv[..., :head_dim], kv[..., head_dim:]
        if p.own is not None:
            own = p.is_own[..., None, None]
            k = torch.where(own, k_rows[p.own].float(), k)
            v = torch.where(own, v_rows[p.own].float(), v)
        if heads != k.shape[2]:  # GQA: each kv head serves heads // kv_heads query heads
            k = k.repeat_interleave(heads // k.shape[2], dim=2)
            v = v.repeat_interleave(heads // v.shape[2], dim=2)
        bias = p.bias
        if score_bias is not None:
            bias = bias.expand(-1, heads, -1, -1).clone()
            for i, g in enumerate(p.groups):
                key_slots = torch.where(p.is_own[i, : g.seq_len], -1, p.slots[i, : g.seq_len]) \
                    if p.own is not None else p.slots[i, : g.seq_len]
                bias[i, :, : g.rows, : g.seq_len] += score_bias(g, key_slots).float()
        qg = q[p.rows].float().transpose(1, 2)  # [G, H, R, D]
        o = F.scaled_dot_product_attention(qg, k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=bias, scale=scale)
        o = o.transpose(1, 2).masked_fill(~p.seen[..., None, None], 0.0)  # [G, R, H, D]
        out[p.rows[p.row_ok]] = o[p.row_ok].to(out.dtype)
    return out
